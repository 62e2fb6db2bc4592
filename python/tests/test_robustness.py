"""Bad input through the Python module (issue 23): each call raises veloxquant.Error (or a
Python exception) with a clear message; nothing crashes, reads out of bounds or returns NaN
scores with a success. Run under ASan+UBSan by scripts/test.sh --sanitize."""

import gc

import numpy as np
import pytest

import veloxquant as vq

from conftest import MODEL

H, D = 2, 4


def kv(pos, value=None):
    k = np.full((1, H, 1, D), float(pos), dtype=np.float32)
    if value is not None:
        k[0, 1, 0, 2] = value
    return k, -k


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_keys_and_values_are_refused(bad):
    cache = vq.LayerCache(vq.CacheConfig.parse("h2o:budget=8,n_sink=1,grace=1"), n_kv_heads=H, head_dim=D)
    k, v = kv(0, bad)
    with pytest.raises(vq.Error, match=r"keys element \(b, h, s, d\) = \(0, 1, 0, 2\) is (nan|inf|-inf)"):
        cache.begin_step(k, v)
    assert not cache.step_open and cache.tokens_seen == 0
    k, v = kv(0)
    v = v.copy()
    v[0, 0, 0, 0] = bad
    with pytest.raises(vq.Error, match=r"values element"):
        cache.begin_step(k, v)


def test_non_finite_attention_is_refused_and_the_step_stays_open():
    cache = vq.LayerCache(vq.CacheConfig.parse("h2o:budget=8,n_sink=1,grace=1"), n_kv_heads=H, head_dim=D)
    k, v = kv(0)
    cache.begin_step(k, v)
    probs = np.ones((1, H, 1, 1), dtype=np.float32)
    probs[0, 1, 0, 0] = np.nan
    with pytest.raises(vq.Error, match=r"attention probability .* = \(0, 1, 0, 0\) is nan"):
        cache.end_step(probs)
    assert cache.step_open
    cache.end_step(np.ones((1, H, 1, 1), dtype=np.float32))
    assert all(np.isfinite(cache.row_scores(0, h)).all() for h in range(H))


def test_stored_views_outlive_the_call():
    cache = vq.LayerCache(vq.CacheConfig.parse("full"), n_kv_heads=H, head_dim=D)
    for pos in range(3):
        cache.update(*kv(pos))
    keys, values, positions = cache.stored(0, 1)
    gc.collect()
    # keys are fp16 rows of value pos (exact): read after the call returned.
    assert positions.tolist() == [0, 1, 2]
    assert keys.astype(np.float32)[:, 0].tolist() == [0.0, 1.0, 2.0]
    assert values.astype(np.float32)[:, 0].tolist() == [0.0, -1.0, -2.0]


def test_huge_python_ints_give_a_clear_error():
    c = vq.CacheConfig.parse("h2o")
    with pytest.raises(vq.Error, match=r"budget must be an integer in \[-9223372036854775808"):
        c["budget"] = 2**70
    with pytest.raises(vq.Error, match=r"h2o_grace must be an integer in"):
        c["h2o_grace"] = -(2**64)
    with pytest.raises(vq.Error, match=r"budget must be an integer in"):
        c.with_token_budget(2**63)
    with pytest.raises(vq.Error, match=r"budget must be an int, got float"):
        c.with_token_budget(1.5)


@pytest.mark.skipif(not MODEL.exists(), reason="data/stories260K.bin missing")
@pytest.mark.parametrize("tokens", [[1, 99999, 3], [1, -5, 3], [1, 2, 2**31 - 1]])
def test_run_forced_refuses_token_ids_outside_the_vocabulary(tokens):
    model = vq.Model.load(str(MODEL))
    with pytest.raises(vq.Error, match=r"outside the model's vocabulary \[0, 512\)"):
        vq.run_forced(model, tokens)
