"""Bad input through the Python module (issue 23): each call raises veloxquant.Error (or a
Python exception) with a clear message; nothing crashes, reads out of bounds or returns NaN
scores with a success. Run under ASan+UBSan by scripts/test.sh --sanitize."""

import gc
import re

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
    # Finite but outside [0, 1]: no probability either (3e38 summed into a score overflows).
    for bad, shown in ((3e38, "3.00000001e+38"), (1.5, "1.5"), (-0.25, "-0.25")):
        probs[0, 1, 0, 0] = bad
        with pytest.raises(vq.Error, match=r"\(0, 1, 0, 0\) is " + re.escape(shown) +
                           r"; attention probabilities must be finite and in \[0, 1\]"):
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


def field_range(method, name):
    """The documented [min, max] of a method's int field, from the registry."""
    info = next(m for m in vq.registry() if m["id"] == method)
    f = next(f for f in info["fields"] if f["name"] == name)
    return int(f["min"]), int(f["max"])


def test_huge_python_ints_give_a_clear_error():
    lo, hi = field_range("h2o", "h2o_budget")
    c = vq.CacheConfig.parse("h2o")
    # 2**70 = 1180591620717411303424 (by hand: 2**10 = 1024, 1024**7).
    with pytest.raises(vq.ArgumentError,
                       match=rf"\[python\] budget must be an integer in \[{lo}, {hi}\], "
                             r"got 1180591620717411303424 \(out of range\)"):
        c["budget"] = 2**70
    glo, ghi = field_range("h2o", "h2o_grace")
    with pytest.raises(ValueError, match=rf"h2o_grace must be an integer in \[{glo}, {ghi}\], "
                                         r"got -18446744073709551616 \(out of range\)"):
        c["h2o_grace"] = -(2**64)
    with pytest.raises(ValueError, match=rf"budget must be an integer in \[{lo}, {hi}\], got 9223372036854775808"):
        c.with_token_budget(2**63)
    with pytest.raises(TypeError, match=r"budget must be an int, got float"):
        c.with_token_budget(1.5)
    # A huge int is summarised by its size, never printed whole.
    with pytest.raises(vq.Error, match=r"got an integer of 100001 bits \(out of range\)") as e:
        c["budget"] = 2**100000
    assert len(str(e.value)) < 200
    # Within 64 bits, set() checks the type only (validate() checks the range), as before.
    c["budget"] = 0
    with pytest.raises(vq.Error, match=r"h2o_budget must be in"):
        c.validate()
    # A float field refuses a non-finite value where it enters.
    with pytest.raises(vq.ArgumentError, match=r"h2o_decay must be a finite number in \[0, 1\], got nan"):
        c["h2o_decay"] = float("nan")


def test_argument_error_is_an_error_and_a_value_error():
    assert issubclass(vq.ArgumentError, vq.Error) and issubclass(vq.ArgumentError, ValueError)
    with pytest.raises(vq.ArgumentError) as e:
        vq.CacheConfig.parse("h2o")["budget"] = 2**64
    assert e.value.code == "invalid_argument"


def test_cache_index_arguments_take_any_int_and_name_the_range():
    cache = vq.LayerCache(vq.CacheConfig.parse("full"), n_kv_heads=H, head_dim=D)
    cache.update(*kv(0))
    with pytest.raises(vq.ArgumentError, match=r"LayerCache.stored: b must be an integer in "
                                               r"\[-9223372036854775808, 9223372036854775807\], "
                                               r"got 1180591620717411303424 \(out of range\)"):
        cache.stored(2**70, 0)
    with pytest.raises(vq.Error, match=r"stored\(b, h\) needs b in \[0, 0\] and h in \[0, 1\], got \(0, 2\)"):
        cache.stored(0, 2)
    with pytest.raises(vq.ArgumentError, match=r"row_scores: h must be an integer in"):
        cache.row_scores(0, -(2**64))
    with pytest.raises(TypeError, match=r"LayerCache.stored: h must be an int, got float"):
        cache.stored(0, 1.0)
    # NumPy integers are ints.
    assert cache.stored(np.int64(0), np.int32(1))[2].tolist() == [0]
    view = cache.begin_step(*kv(1))
    with pytest.raises(IndexError, match=r"StepView.keys: \(b, h\): h must be an integer in \[0, 1\], got 2"):
        view.keys(0, 2)
    with pytest.raises(IndexError, match=r"StepView.values: \(b, h\): b must be an integer in \[0, 0\], "
                                         r"got 1180591620717411303424 \(out of range\)"):
        view.values(2**70, 0)
    assert view.positions(np.int8(0), 1).tolist() == [0, 1]
    cache.end_step()
    with pytest.raises(vq.ArgumentError, match=r"LayerCache: n_kv_heads must be an integer in .*"
                                               r"got 18446744073709551616 \(out of range\)"):
        vq.LayerCache(vq.CacheConfig("full"), n_kv_heads=2**64)
    model = vq.ModelCache(vq.CacheConfig.parse("full"), 2, H, D)
    with pytest.raises(IndexError, match=r"ModelCache.layer: i must be an integer in \[0, 1\], got 2"):
        model.layer(2)
    with pytest.raises(IndexError, match=r"ModelCache\[i\]: i must be an integer in \[0, 1\], "
                                         r"got -1180591620717411303424 \(out of range\)"):
        model[-(2**70)]
    with pytest.raises(vq.ArgumentError, match=r"ModelCache: n_layers must be an integer in"):
        vq.ModelCache(vq.CacheConfig.parse("full"), 2**63, H, D)
    with pytest.raises(vq.ArgumentError, match=r"observe_layer_similarity: cosine must be a finite number, got nan"):
        model.observe_layer_similarity(0, float("nan"))
    with pytest.raises(vq.ArgumentError, match=r"cosine must be a finite number, got an integer of 1025 bits"):
        model.observe_layer_similarity(0, 2**1024)


@pytest.mark.skipif(not MODEL.exists(), reason="data/stories260K.bin missing")
def test_engine_arguments_are_checked_where_they_enter():
    model = vq.Model.load(str(MODEL))
    seq_len = model.config["seq_len"]  # 512 for stories260K (its llama2.c header)
    # steps: the model's context bounds the run's positions (the engine's max_rows), named as
    # the argument; run.c would silently have run seq_len positions instead.
    with pytest.raises(vq.ArgumentError, match=rf"generate: steps must be an integer in \[0, {seq_len}\], got {seq_len + 1}$"):
        vq.generate(model, steps=seq_len + 1)
    with pytest.raises(vq.ArgumentError, match=r"generate: steps must be an integer in \[0, 1048576\], "
                                               r"got 9223372036854775808 \(out of range\)"):
        vq.generate(model, steps=2**63)
    with pytest.raises(vq.ArgumentError, match=r"generate: seed must be an integer in "
                                               r"\[0, 18446744073709551615\], got -1 \(out of range\)"):
        vq.generate(model, steps=4, seed=-1)
    with pytest.raises(vq.ArgumentError, match=r"generate: temperature must be a finite number in \[0, 1e\+06\], got nan"):
        vq.generate(model, steps=4, temperature=float("nan"))
    with pytest.raises(vq.ArgumentError, match=r"generate: top_p must be in \[0, 1\], got 1.5"):
        vq.generate(model, steps=4, top_p=1.5)
    # Issue 33: a temperature that rounds to 0 as a float is refused as the CLI refuses it.
    with pytest.raises(vq.ArgumentError, match=r"generate: temperature must be 0 or at least 1e-30 in magnitude, got 1e-45"):
        vq.generate(model, steps=4, temperature=1e-45)
    with pytest.raises(vq.ArgumentError, match=r"generate: top_p must be 0 or at least 1e-30 in magnitude, got 1e-40"):
        vq.generate(model, steps=4, top_p=1e-40)
    assert vq.generate(model, steps=4, seed=2**64 - 1)["n_decode"] <= 4
    with pytest.raises(vq.ArgumentError, match=r"run_forced: tokens\[1\] must be an integer in "
                                               r"\[-2147483648, 2147483647\], got 1099511627776"):
        vq.run_forced(model, [1, 2**40, 3])
    with pytest.raises(TypeError, match=r"run_forced: tokens\[2\] must be an int, got str"):
        vq.run_forced(model, [1, 2, "3"])
    with pytest.raises(vq.ArgumentError, match=r"run_forced: prefill must be an integer in \[0, 2\], got 3"):
        vq.run_forced(model, [1, 2, 3], prefill=3)
    with pytest.raises(vq.ArgumentError, match=r"eval: tokens must be an integer in \[2, 1048576\], "
                                               r"got 1180591620717411303424 \(out of range\)"):
        vq.eval(str(MODEL), "x.txt", tokens=2**70)
    with pytest.raises(vq.ArgumentError, match=r"eval: budgets\[1\] must be an integer in \[1, 9223372036854775807\], "
                                               r"got 18446744073709551616 \(out of range\)"):
        vq.eval(str(MODEL), "x.txt", budgets=[64, 2**64])
    with pytest.raises(vq.ArgumentError, match=r"eval: prefill must be an integer in \[0, 14\], got 15"):
        vq.eval(str(MODEL), "x.txt", tokens=16, prefill=15)


@pytest.mark.skipif(not MODEL.exists(), reason="data/stories260K.bin missing")
@pytest.mark.parametrize("tokens", [[1, 99999, 3], [1, -5, 3], [1, 2, 2**31 - 1]])
def test_run_forced_refuses_token_ids_outside_the_vocabulary(tokens):
    model = vq.Model.load(str(MODEL))
    with pytest.raises(vq.Error, match=r"outside the model's vocabulary \[0, 512\)"):
        vq.run_forced(model, tokens)


# Issue 33: shapes past the documented limits (include/veloxquant/types.h: 4096 layers, 4096
# heads, head_dim 65536, B x Hkv 65536) raise ArgumentError (a ValueError) before anything is
# allocated; before the limits, ModelCache(cfg, 10**7, ...) built ten million layer caches.
@pytest.mark.parametrize(
    "shape, message",
    [
        ((10**7, 2, 8), r"n_layers must be at most 4096 .*got 10000000"),
        ((4097, 2, 8), r"n_layers must be at most 4096"),
        ((2, 4097, 8), r"n_kv_heads must be at most 4096"),
        ((2, 2, 65537), r"head_dim must be at most 65536"),
    ],
)
def test_model_cache_shape_limits(shape, message):
    config = vq.CacheConfig.parse("streaming_llm:n_sink=1,window_size=3")
    with pytest.raises(ValueError, match=message) as info:
        vq.ModelCache(config, *shape)
    assert isinstance(info.value, vq.ArgumentError) and info.value.code == "invalid_argument"
    with pytest.raises(ValueError, match=r"n_kv_heads must be at most 4096"):
        vq.LayerCache(config, n_kv_heads=4097, head_dim=8)
    assert len(vq.ModelCache(config, 4096, 1, 4)) == 4096  # the limit itself is allowed


# A broadcast array (zero strides) names many rows of one small buffer: read in place, the cache
# would copy every row it names. Refused, as the C API refuses zero or overlapping strides.
def test_broadcast_keys_are_refused_before_any_copy():
    cache = vq.LayerCache(vq.CacheConfig.parse("streaming_llm:n_sink=1,window_size=3"))
    row = np.arange(4, dtype=np.float32)
    big = np.broadcast_to(row, (1, 1, 2**28, 4))  # 4 GiB if copied
    with pytest.raises(ValueError, match=r"keys \[1, 1, 268435456, 4\] with strides \[0, 0, 0, 1\] has "
                                         r"rows that overlap"):
        cache.begin_step(big, big)
    assert not cache.step_open and cache.tokens_seen == 0
    # A copy of a small broadcast is ordinary data, and the same cache takes it.
    small = np.ascontiguousarray(np.broadcast_to(row, (1, 1, 3, 4)))
    view = cache.begin_step(small, -small)
    assert view.n_new == 3
    cache.end_step()
    assert cache.tokens_seen == 3
