"""Cache state save / restore from Python (docs/api.md, "Saving and restoring a cache").

The expectation is the uninterrupted run: a cache saved mid-sequence and restored into a fresh
one, fed the same tokens afterwards, holds the same rows, positions and stats as the original.
"""

import numpy as np
import pytest

import veloxquant as vq

H, D = 2, 32


def tokens(t0, n, seed=3):
    """Keys and values of tokens [t0, t0 + n), [B=1, H, n, D], a fixed pseudo-random sequence."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((1, H, 200, D)).astype(np.float32)
    v = rng.standard_normal((1, H, 200, D)).astype(np.float32)
    return np.ascontiguousarray(k[:, :, t0:t0 + n]), np.ascontiguousarray(v[:, :, t0:t0 + n])


def feed(cache, t0, n, chunk=1):
    for t in range(t0, t0 + n, chunk):
        k, v = tokens(t, min(chunk, t0 + n - t))
        cache.update(k, v)


def same(a, b):
    assert a.stats() == b.stats() or _stats_equal(a.stats(), b.stats())
    for h in range(H):
        (ka, va, pa), (kb, vb, pb) = a.stored(0, h), b.stored(0, h)
        assert np.array_equal(pa, pb)
        assert ka.tobytes() == kb.tobytes()
        assert va.tobytes() == vb.tobytes()
        assert a.row_scores(0, h).tobytes() == b.row_scores(0, h).tobytes()


def _stats_equal(sa, sb):
    # Capacities (allocated_bytes, resident_bytes) are not state: a restored store holds no slack.
    keys = [k for k in sa if k not in ("allocated_bytes", "resident_bytes")]
    return all(sa[k] == sb[k] for k in keys)


@pytest.mark.parametrize("spec", ["h2o:budget=16,n_sink=2", "tova:budget=16,kv_dtype=q8_0",
                                  "kivi:residual_length=8", "snapkv:budget=24,obs_window=8"])
def test_layer_round_trip_bytes_and_file(spec, tmp_path):
    config = vq.CacheConfig.parse(spec)
    orig = vq.LayerCache(config, n_kv_heads=H, head_dim=D)
    feed(orig, 0, 40, chunk=40)
    feed(orig, 40, 5)
    state = orig.save_state()
    assert isinstance(state, bytes) and state[:7] == b"VQSTATE"
    restored = vq.LayerCache(config, n_kv_heads=H, head_dim=D)
    restored.load_state(state)
    assert restored.save_state() == state
    same(orig, restored)
    from_file = vq.LayerCache(config, n_kv_heads=H, head_dim=D)
    path = tmp_path / "layer.vqstate"
    orig.save_state_file(path)          # os.PathLike
    from_file.load_state_file(str(path))
    for t in range(45, 60):
        for c in (orig, restored, from_file):
            feed(c, t, 1)
        same(orig, restored)
        same(orig, from_file)
    restored.load_state(bytearray(state))   # any buffer of bytes
    restored.load_state(memoryview(state))


def test_model_round_trip():
    config = vq.CacheConfig.parse("squeeze:budget=12,n_sink=1")
    shape = dict(n_layers=3, n_kv_heads=H, head_dim=D, n_query_heads=H)
    orig, restored = vq.ModelCache(config, **shape), vq.ModelCache(config, **shape)
    for t in range(20):
        for layer in range(3):
            k, v = tokens(t, 1)
            orig.layer(layer).update(k, v)
    restored.load_state(orig.save_state())
    assert restored.save_state() == orig.save_state()
    for t in range(20, 30):
        for m in (orig, restored):
            for layer in range(3):
                k, v = tokens(t, 1)
                m.layer(layer).update(k, v)
        for layer in range(3):
            same(orig.layer(layer), restored.layer(layer))


def test_errors_leave_the_cache_unchanged(tmp_path):
    config = vq.CacheConfig.parse("h2o:budget=16")
    cache = vq.LayerCache(config, n_kv_heads=H, head_dim=D)
    feed(cache, 0, 20)
    before = cache.save_state()
    bad = bytearray(before)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(vq.Error, match="checksum") as e:
        cache.load_state(bytes(bad))
    assert e.value.code == "invalid_argument"
    with pytest.raises(vq.Error, match="truncated: the header gives a size of"):
        cache.load_state(before[:-5])
    other = vq.LayerCache(vq.CacheConfig.parse("h2o:budget=17"), n_kv_heads=H, head_dim=D)
    with pytest.raises(vq.Error, match="h2o_budget=16"):
        other.load_state(before)
    with pytest.raises(vq.Error, match="data must be bytes"):
        cache.load_state("not bytes")
    with pytest.raises(vq.Error) as e:
        cache.load_state_file(tmp_path / "missing.vqstate")
    assert e.value.code == "file_error" and "missing.vqstate" in str(e.value)
    assert cache.save_state() == before
    cache.begin_step(*tokens(20, 1))
    with pytest.raises(vq.Error, match="step is open") as e:
        cache.save_state()
    assert e.value.code == "invalid_state"
    cache.end_step()
