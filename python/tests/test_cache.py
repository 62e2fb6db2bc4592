"""LayerCache / ModelCache over NumPy arrays.

Expected rows are derived by hand from the method definitions: StreamingLLM keeps the n_sink
first positions plus the most recent budget - n_sink; TOVA with the attention source evicts
the non-sink row the newest query attends to least. Storage is fp16 (2 bytes per element).
"""

import gc

import numpy as np
import pytest

import veloxquant as vq

H, D = 2, 4


def token(pos, dtype=np.float32):
    """keys[h, d] = pos + h/2 + d/4 and values = -keys, [B=1, H, S=1, D]; exact in fp16."""
    k = (pos + 0.5 * np.arange(H)[:, None] + 0.25 * np.arange(D)[None, :]).astype(dtype)
    return k[None, :, None, :], (-k)[None, :, None, :]


def expected_positions(pos):
    """Positions in the view at step `pos` of streaming_llm (2 sinks + 6)."""
    if pos < 8:
        return list(range(pos + 1))
    return [0, 1] + list(range(pos - 6, pos + 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_streaming_view_rows_positions_and_stats(dtype):
    cache = vq.LayerCache(vq.CacheConfig.parse("streaming_llm:n_sink=2,window_size=6"), n_kv_heads=H, head_dim=D)
    assert cache.budget == 8
    for pos in range(20):
        k, v = token(pos, dtype)
        view = cache.begin_step(k, v)
        assert cache.step_open and view.open
        expect = expected_positions(pos)
        assert (view.batch, view.n_kv_heads, view.head_dim, view.n_new) == (1, H, D, 1)
        assert view.n_rows == len(expect)
        for h in range(H):
            keys, values, positions = view.keys(0, h), view.values(0, h), view.positions(0, h)
            assert keys.dtype == np.float16 and keys.shape == (len(expect), D)
            assert positions.dtype == np.int32
            assert positions.tolist() == expect
            want = np.array([token(p)[0][0, h, 0] for p in expect])
            np.testing.assert_array_equal(keys.astype(np.float32), want)
            np.testing.assert_array_equal(values.astype(np.float32), -want)
        cache.end_step()
        assert not view.open
    s = cache.stats()
    assert s["tokens_seen"] == 20 and s["tokens_kept"] == 8
    assert s["tokens_kept_per_head"] == [8, 8]
    assert s["kept_bytes"] == 8 * H * 2 * D * 2
    assert s["full_bytes"] == 20 * H * 2 * D * 2
    assert s["compression_ratio"] == pytest.approx(2.5)
    assert s["evictions"] == 12 * H and s["merges"] == 0
    assert s["resident_bytes"] >= s["allocated_bytes"] >= s["kept_bytes"]
    keys, values, positions = cache.stored(0, 1)
    assert positions.tolist() == [0, 1, 14, 15, 16, 17, 18, 19]
    cache.reset()
    assert cache.tokens_seen == 0 and cache.stats()["kept_bytes"] == 0


def test_view_arrays_are_read_only_views_that_expire():
    cache = vq.LayerCache(vq.CacheConfig("full"))
    k, v = token(0)
    view = cache.begin_step(k, v)
    keys = view.keys(0, 0)
    assert not keys.flags.owndata and not keys.flags.writeable
    assert keys.base is view  # the array keeps the view (and through it the cache) alive
    with pytest.raises(ValueError):
        keys[0, 0] = 1
    with pytest.raises(IndexError):
        view.keys(0, H)
    cache.end_step()
    with pytest.raises(vq.Error) as e:
        view.keys(0, 0)
    assert e.value.code == "invalid_state"


def test_view_points_into_cache_storage():
    """Zero copy: the rows stored after a step are the memory the next step's view shows (no
    copy in between); after the step, stored() shows the rows kept."""
    cache = vq.LayerCache(vq.CacheConfig.parse("streaming_llm:n_sink=2,window_size=6"))
    for pos in range(12):
        cache.update(*token(pos))
    stored_keys, _, stored_pos = cache.stored(0, 0)
    view = cache.begin_step(*token(12))
    view_keys = view.keys(0, 0)
    addr = lambda a: a.__array_interface__["data"][0]
    assert addr(view_keys) == addr(stored_keys)
    assert np.shares_memory(view_keys, stored_keys)
    np.testing.assert_array_equal(view_keys[:8], stored_keys)
    cache.end_step()
    # The rows kept: 0, 1, 7..12 (the earlier arrays are invalidated by the step: the cache may
    # have moved its rows, e.g. the two sinks up by one slot instead of the window down).
    _, _, kept_pos = cache.stored(0, 0)
    assert kept_pos.tolist() == [0, 1, 7, 8, 9, 10, 11, 12]


def test_strided_inputs_are_read_in_place_and_match_contiguous():
    """keys given token-major ([S][H][D] memory, a transposed view) store the same rows as the
    same values given contiguously; a non-contiguous last axis is copied first."""
    rng = np.random.default_rng(1)
    tok_major = rng.standard_normal((1, 5, H, D)).astype(np.float32)  # [B, S, H, D]
    strided = tok_major.transpose(0, 2, 1, 3)  # [B, H, S, D] view, not contiguous
    assert not strided.flags.c_contiguous
    contiguous = np.ascontiguousarray(strided)
    last_axis_strided = np.asfortranarray(contiguous)
    results = []
    for arr in (strided, contiguous, last_axis_strided):
        cache = vq.LayerCache(vq.CacheConfig.parse("full:kv_dtype=f32"))
        ks, vs, pos = cache.update(arr, arr * 2)
        results.append((ks, vs, pos))
        assert ks.shape == (1, H, 5, D) and pos.shape == (1, H, 5)
    for ks, vs, pos in results:
        np.testing.assert_array_equal(ks, contiguous)  # kv_dtype=f32 stores exactly
        np.testing.assert_array_equal(vs, contiguous * 2)
        assert pos[0, 0].tolist() == [0, 1, 2, 3, 4]


def test_bad_inputs_raise():
    cache = vq.LayerCache(vq.CacheConfig("full"), n_kv_heads=H, head_dim=D)
    k, v = token(0)
    with pytest.raises(TypeError, match="float32 or float16"):
        cache.begin_step(k.astype(np.float64), v)
    with pytest.raises(vq.Error) as e:
        cache.begin_step(k[0], v[0])
    assert e.value.code == "shape_mismatch"
    with pytest.raises(vq.Error) as e:
        cache.begin_step(np.zeros((1, H, 1, D + 1), np.float32), np.zeros((1, H, 1, D + 1), np.float32))
    assert e.value.code == "shape_mismatch"
    with pytest.raises(vq.Error) as e:
        cache.end_step()
    assert e.value.code == "invalid_state"
    cache.begin_step(k, v)
    with pytest.raises(vq.Error) as e:
        cache.begin_step(k, v)
    assert e.value.code == "invalid_state"
    with pytest.raises(vq.Error) as e:
        cache.end_step(np.ones((1, H, 1, 2), np.float32))  # R is 1, not 2
    assert e.value.code == "shape_mismatch"
    cache.end_step()
    unvalidated = vq.CacheConfig("h2o")
    unvalidated["budget"] = 0  # set() type-checks; the cache constructor validates
    with pytest.raises(vq.Error) as e:
        vq.LayerCache(unvalidated)
    assert e.value.code == "invalid_config" and "h2o_budget" in str(e.value)


def test_attention_probabilities_decide_tova():
    """tova, budget 3 with 1 sink, source=attention: at the 4th token the probabilities over the
    4 rows are {0.1, 0.5, 0.05, 0.35}; row 0 is a sink, so position 2 leaves."""
    model = vq.ModelCache(vq.CacheConfig.parse("tova:budget=3,n_sink=1,source=attention"),
                          n_layers=2, n_kv_heads=1, head_dim=2, n_query_heads=1)
    layer = model.layer(0)
    assert model.layer(0) is layer and model[0] is layer and len(model) == 2
    assert model.layer_budgets() == [3, 3]
    probs = [[1.0], [0.5, 0.5], [0.25, 0.25, 0.5], [0.1, 0.5, 0.05, 0.35]]
    for pos, p in enumerate(probs):
        kv = np.array([pos, 0], np.float32).reshape(1, 1, 1, 2)
        view = layer.begin_step(kv, kv)
        assert view.n_rows == pos + 1
        layer.end_step(np.array(p, np.float64).reshape(1, 1, 1, -1))  # float64 is converted
    assert layer.stored(0, 0)[2].tolist() == [0, 1, 3]
    s = model.stats()
    assert (s["tokens_seen"], s["tokens_kept"], s["evictions"]) == (4, 3, 1)
    assert model.layer(1).tokens_seen == 0
    with pytest.raises(IndexError):
        model.layer(2)
    # A layer keeps its model cache alive.
    del model
    gc.collect()
    assert layer.tokens_seen == 4 and layer.stored(0, 0)[2].tolist() == [0, 1, 3]


def test_headwise_heads_hold_different_row_counts():
    """h2o, budget 3, no sinks or recent window, decay 1, true attention, headwise with floor
    0.5 (1 row per head): scores are the column sums of the attention. After a 4-token prefill,
    head 0 (concentrated) has masses {3.7, .19, .08, .03} and head 1 (spread)
    {2.05, 1.05, .65, .25}; the layer keeps 6 of 8, each head its best row first, and the two
    lowest of the rest leave (head 0's .03 and .08): head 0 keeps positions {0, 1}, head 1
    {0, 1, 2, 3}."""
    layer = vq.LayerCache(
        vq.CacheConfig.parse("h2o:budget=3,n_sink=0,grace=0,decay=1,source=attention,"
                             "headwise=true,headwise_floor=0.5"),
        n_kv_heads=2, head_dim=2, n_query_heads=2)
    kv = np.arange(16, dtype=np.float32).reshape(1, 2, 4, 2)
    view = layer.begin_step(kv, kv)
    assert view.n_rows == 4
    probs = np.zeros((1, 2, 4, 4), np.float32)
    head0 = [[1.0], [0.9, 0.1], [0.9, 0.05, 0.05], [0.9, 0.04, 0.03, 0.03]]
    head1 = [[1.0], [0.5, 0.5], [0.3, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]
    for h, rows in enumerate([head0, head1]):
        for j, p in enumerate(rows):
            probs[0, h, j, :len(p)] = p
    layer.end_step(probs)
    assert layer.stored(0, 0)[2].tolist() == [0, 1]
    assert layer.stored(0, 1)[2].tolist() == [0, 1, 2, 3]
    # The next step's view: R = 5 (head 1), head 0 holds 3 rows; stack() pads head 0.
    nxt = np.full((1, 2, 1, 2), 7.0, np.float32)
    view = layer.begin_step(nxt, nxt)
    assert view.n_rows == 5
    assert view.positions(0, 0).tolist() == [0, 1, 4]
    assert view.positions(0, 1).tolist() == [0, 1, 2, 3, 4]
    keys, values, positions = view.stack()
    assert positions[0, 0].tolist() == [0, 1, 4, -1, -1]
    assert not keys[0, 0, 3:].any() and not values[0, 0, 3:].any()
    step = np.array([[0.2, 0.1, 0.7, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1, 0.6]], np.float32)
    layer.end_step(step.reshape(1, 2, 1, 5))  # head 0's columns past its 3 rows are 0
    # Masses: head 0 {3.9, .29, .7}, head 1 {2.15, 1.15, .75, .35, .6}; .29 and .35 leave.
    assert layer.stored(0, 0)[2].tolist() == [0, 4]
    assert layer.stored(0, 1)[2].tolist() == [0, 1, 2, 4]


def test_duoattention_head_pattern_file(tmp_path):
    """2 layers of H = 2 KV heads, ratio 0.5 (one retrieval head a layer), n_sink 1, window 2:
    layer 0's scores 0.2, 0.8 make head 1 the retrieval head (keeps 0..5 after 6 tokens) and
    head 0 streaming (the sink 0 and the window 4, 5); layer 1's 0.9, 0.1 the reverse."""
    path = tmp_path / "full_attention_heads.tsv"
    path.write_text("0.2\t0.8\n0.9\t0.1\n")
    model = vq.ModelCache(vq.CacheConfig.parse("duoattention:n_sink=1,window=2"), 2, H, D)
    model.load_head_pattern(str(path))
    for layer in range(2):
        for pos in range(6):
            k, v = token(pos)
            model.layer(layer).update(k, v)
    assert model.layer(0).head_types() == [2, 1]
    assert model.layer(1).head_types() == [1, 2]
    assert model.layer(0).stored(0, 0)[2].tolist() == [0, 4, 5]
    assert model.layer(0).stored(0, 1)[2].tolist() == list(range(6))
    s = model.stats()
    assert (s["retrieval_heads"], s["streaming_heads"]) == (2, 2)
    assert s["retrieval_bytes"] + s["streaming_bytes"] == s["kept_bytes"]
    bad = tmp_path / "bad.tsv"
    bad.write_text("0.2\tx\n0.9\t0.1\n")
    with pytest.raises(Exception, match="line 1: field 2: expected a number"):
        vq.ModelCache(vq.CacheConfig.parse("duoattention"), 2, H, D).load_head_pattern(str(bad))


def test_qfilters_needs_key_filters_and_keeps_the_hand_derived_rows():
    # The case of tests/test_qfilters.cpp (KeepsTheHandDerivedRows), head 0: filter (0.6, 0.8),
    # keys (1,0) (0,1) (1,1) (-1,0) (0,-1) (2,0) (0,.5) (.5,.5) scored .6 .8 1.4 -.6 -.8 1.2 .4 .7;
    # budget 4, one sink, the newest row protected: positions 3, 4, 1 then 6 leave.
    cache = vq.LayerCache(vq.CacheConfig.parse("qfilters:budget=4,n_sink=1,grace=1,kv_dtype=f32"),
                          n_kv_heads=1, head_dim=2)
    assert cache.needs_key_filters
    keys = np.array([[1, 0], [0, 1], [1, 1], [-1, 0], [0, -1], [2, 0], [0, .5], [.5, .5]], np.float32)
    with pytest.raises(vq.Error, match="set_key_filters"):
        cache.update(keys[None, None, :1], keys[None, None, :1])
    assert cache.tokens_seen == 0
    with pytest.raises(vq.Error, match="got 3"):
        cache.set_key_filters(np.zeros(3, np.float32))
    cache.set_key_filters(np.array([[0.6, 0.8]]))
    for t in range(8):
        cache.update(keys[None, None, t:t + 1], keys[None, None, t:t + 1])
    assert list(cache.stored(0, 0)[2]) == [0, 2, 5, 7]
    model = vq.ModelCache(vq.CacheConfig.parse("qfilters"), 2, 1, 2)
    assert model.needs_key_filters
    model.set_key_filters(np.ones((2, 1, 2), np.float32))


def test_head_pattern_arrays_type_the_heads_as_the_file_does():
    """The case of test_duoattention_head_pattern_file, given as arrays: layer 0's scores 0.2,
    0.8 make head 1 the retrieval head, layer 1's 0.9, 0.1 head 0."""
    model = vq.ModelCache(vq.CacheConfig.parse("duoattention:n_sink=1,window=2"), 2, H, D)
    with pytest.raises(vq.Error, match=r"\[n_layers, n_kv_heads\], got shape \[3\]"):
        model.set_head_pattern(np.zeros(3))
    model.set_head_pattern([[0.2, 0.8], [0.9, 0.1]])
    single = vq.LayerCache(vq.CacheConfig.parse("duoattention:n_sink=1,window=2"), n_kv_heads=H, head_dim=D)
    single.set_head_pattern(np.array([0.9, 0.1]))
    for pos in range(6):
        k, v = token(pos)
        for layer in range(2):
            model.layer(layer).update(k, v)
        single.update(k, v)
    assert model.layer(0).head_types() == [2, 1]
    assert model.layer(1).head_types() == [1, 2]
    assert single.head_types() == [1, 2]
    assert model.layer(0).stored(0, 0)[2].tolist() == [0, 4, 5]
    assert single.stored(0, 1)[2].tolist() == [0, 4, 5]
    with pytest.raises(vq.Error, match="1-D"):
        single.set_head_pattern(np.zeros((2, 2)))
    with pytest.raises(vq.Error):
        vq.LayerCache(vq.CacheConfig.parse("snapkv"), n_kv_heads=H, head_dim=D).set_head_pattern([1.0, 2.0])


def test_criticalkv_output_gram_keeps_the_low_attention_row_with_a_large_projected_value():
    """tests/test_criticalkv.cpp's hand case: one head, D = 2, budget 4, no sinks, the last
    query's attention to rows 0..5 is .30 .25 .05 .20 .10 .10; v_2 = (0, 1), every other v =
    (1, 0). W_o = diag(1, 10): G = diag(1, 100), ||W_o v_2|| = 10, the others 1. Stage 1
    (floor(0.5 x 3) = 1 row) keeps row 0; stage 2 weighs (a + 1e-4) x N = .2501 .5010 .2001
    .1001 over rows 1..4: rows 2 and 1. Without W_o every N = 1: rows 1 and 3 (SnapKV's)."""
    def kept(gram):
        c = vq.LayerCache(vq.CacheConfig.parse(
            "criticalkv:budget=4,n_sink=0,obs_window=1,kernel=1,source=attention,kv_dtype=f32"),
            n_kv_heads=1, head_dim=2, n_query_heads=1)
        assert c.reads_output_gram
        if gram is not None:
            c.set_output_gram(gram)
        assert c.has_output_gram == (gram is not None)
        v = np.array([[1, 0], [1, 0], [0, 1], [1, 0], [1, 0], [1, 0]], np.float32)
        c.begin_step(np.zeros((1, 1, 6, 2), np.float32), v[None, None])
        att = np.zeros((6, 6), np.float32)
        for q in range(5):
            att[q, :q + 1] = 1.0 / (q + 1)
        att[5] = [0.30, 0.25, 0.05, 0.20, 0.10, 0.10]
        c.end_step(att[None, None])
        return c.stored(0, 0)[2].tolist()

    assert kept(np.diag([1.0, 100.0])[None]) == [0, 1, 2, 5]
    assert kept(None) == [0, 1, 3, 5]
    c = vq.LayerCache(vq.CacheConfig.parse("criticalkv"), n_kv_heads=1, head_dim=2, n_query_heads=1)
    with pytest.raises(vq.Error, match=r"\[n_query_heads, head_dim, head_dim\]"):
        c.set_output_gram(np.eye(2))
    with pytest.raises(vq.Error, match="set_output_gram"):
        c.set_output_gram(np.array([[[1.0, 0.0], [0.0, np.nan]]]))
    model = vq.ModelCache(vq.CacheConfig.parse("criticalkv"), 2, 1, 2, 1)
    model.set_output_gram(1, np.eye(2)[None])
    assert not model.layer(0).has_output_gram and model.layer(1).has_output_gram
    with pytest.raises(IndexError):
        model.set_output_gram(2, np.eye(2)[None])


def ea_inputs(S):
    """tests/expected_attention_inputs.h's tokens 0..S-1 (exact in fp32): keys and values
    [1, 2, S, 8], queries [1, 4, S, 8]."""
    t = np.arange(S)[None, :, None]
    c = np.arange(8)[None, None, :]
    h2 = np.arange(2)[:, None, None]
    h4 = np.arange(4)[:, None, None]
    k = ((7 * t * t + 13 * t * c + 31 * h2 + 5 * c * c + 3) % 29 - 14) / 8.0
    v = ((3 * t * t + 11 * t * c + 17 * h2 + 2 * c * c + 1) % 23 - 11) / 8.0
    q = ((5 * t * t + 3 * t * c + 19 * h4 + 7 * c * c + 2) % 31 - 15) / 8.0
    return [x.astype(np.float32)[None] for x in (k, v, q)]


def test_expected_attention_reads_the_queries_and_keeps_the_numpy_reference_rows():
    """The prefill case of tests/expected_attention_reference.py (NumPy from kvpress's rule):
    24 tokens in one step, budget 10, 2 sinks; head 0 keeps 0 1 4 7 10 12 15 18 19 21."""
    spec = "expected_attention:budget=10,n_sink=2,n_future=5,n_window=16,interval=3,kv_dtype=f32"
    k, v, q = ea_inputs(24)
    freq = (50.0 ** (-2.0 * np.arange(4) / 8)).astype(np.float32)
    c = vq.LayerCache(vq.CacheConfig.parse(spec), n_kv_heads=2, head_dim=8, n_query_heads=4)
    assert c.reads_queries and not c.has_rope
    c.begin_step(k, v)
    with pytest.raises(vq.Error, match="set_rope"):
        c.end_step(queries=q)
    with pytest.raises(vq.Error, match="pairing"):
        c.set_rope(freq, pairing="neox")
    with pytest.raises(vq.Error, match="1-D"):
        c.set_rope(np.zeros((2, 2)))
    c.set_rope(freq)
    assert c.has_rope
    bad = q.copy()
    bad[0, 1, 3, 2] = np.inf
    with pytest.raises(vq.Error, match="queries"):
        c.end_step(queries=bad)
    with pytest.raises(vq.Error, match=r"\[B, Hq, S, D\]"):
        c.end_step(queries=q[0])
    with pytest.raises(vq.Error, match="queries"):
        c.end_step(queries=q[:, :2])
    c.end_step(queries=q.astype(np.float16).astype(np.float32))  # exact in fp16 too
    assert c.stored(0, 0)[2].tolist() == [0, 1, 4, 7, 10, 12, 15, 18, 19, 21]
    # fp16 queries, read as fp16, give the same rows (the values are exact in fp16).
    c16 = vq.LayerCache(vq.CacheConfig.parse(spec), n_kv_heads=2, head_dim=8, n_query_heads=4)
    c16.set_rope(freq, pairing="interleaved")
    c16.begin_step(k, v)
    c16.end_step(queries=q.astype(np.float16))
    assert c16.stored(0, 0)[2].tolist() == [0, 1, 4, 7, 10, 12, 15, 18, 19, 21]


def test_think_prunes_prompt_key_channels_from_the_queries():
    """think=0.5 on the inputs of tests/think_reference.py (queries case): head 0 keeps key
    channels {0, 1, 3, 4}, head 1 {0, 1, 4, 6} (that script's NumPy derivation), the 6 prompt
    rows read 0 in the other channels, the decode row stays whole; 720 bytes (f32) held."""
    hkv, hq, d, s = 2, 4, 8, 6
    k, v, q = ea_inputs(s + 1)  # the same inputs as tests/think_reference.py
    cache = vq.LayerCache(vq.CacheConfig.parse("think:think_window=3,kv_dtype=f32"),
                          n_kv_heads=hkv, head_dim=d, n_query_heads=hq)
    assert cache.reads_queries
    cache.set_rope(np.array([50.0 ** (-2.0 * i / d) for i in range(d // 2)], np.float32))
    cache.begin_step(k[:, :, :s], v[:, :, :s])
    cache.end_step(queries=q[:, :, :s])
    assert not cache.reads_queries
    cache.update(k[:, :, s:], v[:, :, s:])
    for h, kept in enumerate([{0, 1, 3, 4}, {0, 1, 4, 6}]):
        keys, values, positions = cache.stored(0, h)
        assert positions.tolist() == list(range(s + 1))
        want = k[0, h].copy()
        want[:s, [c for c in range(d) if c not in kept]] = 0.0
        np.testing.assert_array_equal(np.asarray(keys, np.float32), want)
        np.testing.assert_array_equal(np.asarray(values, np.float32), v[0, h])
    assert cache.stats()["kept_bytes"] == 720
    with pytest.raises(vq.Error, match="pairing"):
        cache.set_rope(np.ones(d // 2, np.float32), pairing="neox")


def test_finch_question_length_sets_the_window():
    # Eight equal keys: every window query's proxy weights are uniform over the rows before it,
    # so every candidate ties and the lowest positions win. Budget 5, no sinks: with a question
    # of 3 tokens the window is positions 5..7 and rows 0, 1 are kept; without one the window is
    # obs_window = 1 row (7) and rows 0..3 are kept.
    kv = np.zeros((1, 1, 8, 2), np.float32)
    spec = "finch:budget=5,n_sink=0,obs_window=1,kv_dtype=f32"
    cache = vq.LayerCache(vq.CacheConfig.parse(spec), n_kv_heads=1, head_dim=2)
    assert cache.reads_question
    with pytest.raises(vq.Error, match="set_question_length"):
        cache.set_question_length(-1)
    cache.set_question_length(3)
    assert cache.question_length == 3
    cache.update(kv, kv)
    assert cache.question_length == 0
    assert list(cache.stored(0, 0)[2]) == [0, 1, 5, 6, 7]
    cache.reset()
    cache.update(kv, kv)
    assert list(cache.stored(0, 0)[2]) == [0, 1, 2, 3, 7]
    cache.reset()
    cache.set_question_length(9)  # longer than the step: refused, nothing appended
    with pytest.raises(vq.Error, match="only 8 new rows"):
        cache.update(kv, kv)
    assert cache.tokens_seen == 0
    model = vq.ModelCache(vq.CacheConfig.parse("finch"), 2, 1, 2)
    assert model.reads_question
    model.set_question_length(2)
    assert not vq.ModelCache(vq.CacheConfig.parse("snapkv"), 2, 1, 2).reads_question


def test_kvzip_reconstruction_pass_keeps_the_hand_derived_rows():
    # The case of tests/test_kvzip_capi.cpp: a 6-row prompt, one reconstruction step of 2 queries
    # whose probabilities put (max) .3 on row 2, .5 on row 4, .6 on row 5 and at most .1 on rows
    # 1 and 3: budget 3 with sink row 0 keeps rows 0, 4, 5.
    cache = vq.LayerCache(vq.CacheConfig.parse("kvzip:budget=3,n_sink=1,headwise=false,chunk=16"),
                          n_kv_heads=1, head_dim=2, n_query_heads=1)
    assert cache.reads_reconstruction and cache.reconstruction_chunk == 16
    cache.set_reconstruction(True)
    k = np.full((1, 1, 6, 2), 0.5, np.float32)
    cache.update(k, k)
    with pytest.raises(vq.Error, match="reconstruction"):
        cache.compress()
    kr = np.full((1, 1, 2, 2), 0.25, np.float32)
    p = np.array([[[[.1, 0, .3, 0, .5, 0, .1, 0], [.1, .1, .1, 0, 0, .6, .05, .05]]]], np.float32)
    cache.begin_step(kr, kr)
    with pytest.raises(vq.Error, match="B, Hq, S, R"):
        cache.end_reconstruction_step(p[..., :7])
    assert not cache.step_open and cache.tokens_seen == 6
    cache.begin_step(kr, kr)
    cache.end_reconstruction_step(p)
    assert cache.tokens_seen == 6 and cache.tokens_kept == 6
    cache.compress()
    assert list(cache.stored(0, 0)[2]) == [0, 4, 5]
