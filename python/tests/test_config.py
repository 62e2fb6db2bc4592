"""CacheConfig, the registry and errors from Python."""

import ctypes

import pytest

import veloxquant as vq


def test_parse_and_spec_round_trip():
    c = vq.CacheConfig.parse("streaming_llm:n_sink=2,window_size=6")
    assert c.method == "streaming_llm"
    # Keys resolve with or without the method prefix.
    assert c["n_sink"] == 2
    assert c.get("stream_window_size") == 6
    assert c.resolve("window_size") == "stream_window_size"
    assert "merge" in c and "colour" not in c
    assert c.token_budget == 8
    assert vq.CacheConfig.parse(c.spec()) == c
    assert vq.CacheConfig.parse(c.spec(all_fields=True)) == c
    assert vq.CacheConfig("full").token_budget is None
    assert str(vq.CacheConfig()) == "full"


def test_set_typed_values_and_validate():
    c = vq.CacheConfig("h2o")
    c["budget"] = 64
    c.set("grace", "8")  # text goes through the field's parser
    c["kv_dtype"] = "f32"
    assert c.fields()["h2o_budget"] == 64
    assert c["h2o_grace"] == 8
    c.validate()
    c["budget"] = 0  # accepted by set, rejected by validate
    with pytest.raises(vq.Error) as e:
        c.validate()
    assert e.value.code == "invalid_config"
    assert "h2o_budget" in str(e.value) and "got 0" in str(e.value)
    with pytest.raises(vq.Error):
        c.set("budget", [1, 2])
    with pytest.raises(vq.Error) as e:
        c.set("no_such_field", 1)
    assert e.value.code == "invalid_argument"
    b = c.with_token_budget(32)
    assert b["budget"] == 32 and c["budget"] == 0


def test_merge_options_are_shared_and_keep_their_per_method_names():
    c = vq.CacheConfig("h2o")
    # merge is a shared option group: one name for every method that evicts...
    assert c["merge"] == "drop" and c.resolve("merge") == "merge"
    # ...and the names each method gave it before are aliases of the same field.
    c["h2o_merge"] = "sim_weighted"
    c.set("h2o_merge_gate", False)
    c["target"] = "nearest"
    assert c["merge"] == "sim_weighted" and c["h2o_merge"] == "sim_weighted"
    assert c["merge_gate"] is False
    assert c.resolve("h2o_target") == "merge_target"
    assert c.spec() == "h2o:merge=sim_weighted,merge_gate=false"
    assert vq.CacheConfig.parse("h2o:h2o_merge=sim_weighted,h2o_merge_gate=false") == c
    assert "merge" not in vq.CacheConfig("full") and "kivi_merge" not in vq.CacheConfig("kivi")
    fields = {f["name"]: f for f in vq.registry()[vq.method_ids().index("tova")]["fields"]}
    assert fields["merge_gate"]["group"] == "merge"
    assert fields["merge_gate"]["aliases"] == ["tova_merge_gate"]
    assert fields["merge_target"]["aliases"] == ["target", "tova_target"]
    assert fields["tova_budget"]["group"] == "" and fields["tova_budget"]["aliases"] == []
    assert fields["headwise"]["group"] == "headwise" and fields["seed"]["group"] == "common"


@pytest.mark.parametrize(
    "spec, code",
    [
        ("h2o:budget=0", "invalid_config"),
        ("h2o:budget", "invalid_spec"),
        ("h2o:colour=red", "invalid_spec"),
        ("no_such_method", "unknown_method"),
        ("h2o:budget=abc", "invalid_spec"),
    ],
)
def test_errors_carry_code_and_the_c_api_message(spec, code, libveloxquant):
    with pytest.raises(vq.Error) as e:
        vq.CacheConfig.parse(spec)
    assert e.value.code == code
    # The same message as the C API (a different binding of the same library) reports.
    lib = libveloxquant
    lib.vq_config_parse.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
    lib.vq_error_message.restype = ctypes.c_char_p
    lib.vq_error_message.argtypes = [ctypes.c_void_p]
    lib.vq_error_free.argtypes = [ctypes.c_void_p]
    config, error = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.vq_config_parse(spec.encode(), ctypes.byref(config), ctypes.byref(error)) != 0
    assert lib.vq_error_message(error).decode() == str(e.value)
    lib.vq_error_free(error)


def test_registry_lists_every_method_with_fields():
    reg = vq.registry()
    ids = [m["id"] for m in reg]
    assert ids == vq.method_ids()
    assert len(set(ids)) == len(ids)
    assert ids[0] == "full" and {"streaming_llm", "h2o", "tova", "snapkv", "kivi"} <= set(ids)
    for m in reg:
        config = vq.CacheConfig(m["id"])
        config.validate()
        assert m["has_token_budget"] == (config.token_budget is not None)
        for f in m["fields"]:
            assert config[f["name"]] == f["default"]
            assert f["type"] in ("int", "float", "bool", "enum")
            if f["type"] in ("int", "float"):
                assert f["min"] <= f["default"] <= f["max"]
            else:
                assert str(f["default"]).lower() in f["choices"]
            assert f["doc"]
    assert "| `h2o` |" in vq.method_table_markdown()
