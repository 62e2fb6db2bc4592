"""Randomized arguments through every integer and real argument of the module (issue 23): huge
and negative Python ints, NumPy integers, floats, NaN, infinities, bools, strings, None and
lists. Each call must either succeed or raise veloxquant.Error (ArgumentError for a range),
IndexError or TypeError with the module's own message naming the argument ("[python] ..."),
never pybind11's "Unable to cast Python instance to C++ type" or its list of signatures, and never
crash. Deterministic (seeded); run under ASan+UBSan by scripts/test.sh --sanitize, where a read
out of bounds in the argument conversions would abort the interpreter."""

import math
import random

import numpy as np
import pytest

import veloxquant as vq

from conftest import MODEL

ROUNDS = 300  # values tried per argument


def pool(rng):
    """One random value: edges of 32, 64 and 128 bits, big ints, other kinds."""
    k = rng.randrange(12)
    if k == 0:
        return rng.choice([0, 1, -1, 2, 3, 7, 8, 15, 16])
    if k == 1:
        e = rng.choice([31, 32, 63, 64, 70, 127, 128, 1000, 5000])
        return rng.choice([1, -1]) * (2**e + rng.randrange(-2, 3))
    if k == 2:
        return rng.randrange(-(2**70), 2**70)
    if k == 3:
        return rng.choice([np.int8, np.int16, np.int32, np.int64, np.uint64, np.uint8])(rng.randrange(0, 100))
    if k == 4:
        return rng.choice([0.0, 0.5, -0.5, 1.0, 1.5, 1e308, -1e308, 5e-324])
    if k == 5:
        return rng.choice([math.nan, math.inf, -math.inf])
    if k == 6:
        return rng.choice([True, False])
    if k == 7:
        return rng.choice(["1", "", "x", "2**70"])
    if k == 8:
        return None
    if k == 9:
        return rng.choice([[1], [], (0, 1)])
    if k == 10:
        return np.float32(rng.choice([0.25, np.nan]))
    return rng.randrange(-4, 20)


def call(fn, *args, **kwargs):
    """Runs fn; returns the exception raised (None on success), failing on a foreign one."""
    try:
        fn(*args, **kwargs)
    except (vq.Error, IndexError, TypeError) as e:
        text = str(e)
        assert "Unable to cast" not in text and "incompatible function arguments" not in text, text
        if isinstance(e, (vq.ArgumentError, IndexError, TypeError)):  # an argument: named
            assert text.startswith("[python] ") or text.startswith("["), f"unclear: {text!r}"
        return e
    return None


def test_cache_arguments_under_random_values():
    rng = random.Random(23)
    H, D = 2, 4
    cache = vq.LayerCache(vq.CacheConfig.parse("h2o:budget=8,n_sink=1,grace=1"), n_kv_heads=H, head_dim=D)
    k = np.ones((1, H, 1, D), np.float32)
    cache.update(k, -k)
    model = vq.ModelCache(vq.CacheConfig.parse("full"), 2, H, D)
    config = vq.CacheConfig.parse("h2o")
    raised = 0
    for _ in range(ROUNDS):
        a, b = pool(rng), pool(rng)
        raised += call(cache.stored, a, b) is not None
        raised += call(cache.row_scores, a, b) is not None
        view = cache.begin_step(k, -k)
        for entry in (view.keys, view.values, view.positions):
            raised += call(entry, a, b) is not None
        cache.end_step()
        raised += call(model.layer, a) is not None
        raised += call(model.__getitem__, a) is not None
        raised += call(model.observe_layer_similarity, a, b) is not None
        c = config.copy()
        for key in ("budget", "h2o_grace", "h2o_decay", "n_sink"):
            raised += call(c.__setitem__, key, a) is not None
        raised += call(config.with_token_budget, a) is not None
    # The pools make most calls fail; the caches still work afterwards.
    assert raised > ROUNDS
    # h2o:budget=8 keeps 8 of the 1 + ROUNDS tokens fed.
    assert cache.tokens_seen == 1 + ROUNDS and len(cache.stored(0, 1)[2]) == 8


@pytest.mark.skipif(not MODEL.exists(), reason="data/stories260K.bin missing")
def test_engine_arguments_under_random_values():
    rng = random.Random(2323)
    model = vq.Model.load(str(MODEL))
    for _ in range(ROUNDS // 3):
        a, b = pool(rng), pool(rng)
        # Small valid values run (a few positions); everything else is refused where it enters.
        call(vq.generate, model, steps=a, seed=b)
        call(vq.generate, model, steps=2, temperature=a, top_p=b)
        call(vq.run_forced, model, [1, a, 3], prefill=b)
        call(vq.run_forced, model, a)
        call(vq.eval, str(MODEL), "no-such-text.txt", tokens=a, prefill=b, budgets=[a])
