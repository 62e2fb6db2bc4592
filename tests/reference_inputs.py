"""Inputs shared by the NumPy reference scripts (criticalkv, finch, kvzip): u(seed, i), a
splitmix64 hash of i under `seed` as a float in [-0.5, 0.5); tests/test_util.h's hash_uniform
computes the same values in C++."""

M64 = (1 << 64) - 1


def u(seed, i):
    z = (seed * 0x9E3779B97F4A7C15 + (i + 1) * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 31
    z = (z * 0x94D049BB133111EB) & M64
    z ^= z >> 29
    return (z >> 11) / float(1 << 53) - 0.5
