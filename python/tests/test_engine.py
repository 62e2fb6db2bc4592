"""The engine from Python against the CLI (the same C++ code reached two ways)."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import veloxquant as vq
from conftest import MODEL, TEXT, TOKENIZER


@pytest.fixture(scope="module")
def model():
    return vq.Model.load(str(MODEL))


def test_model_and_tokenizer(model):
    c = model.config
    # stories260K's header (llama2.c): dim 64, 5 layers, 8 heads, 4 KV heads, vocab 512, 512 ctx.
    assert (c["format"], c["dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"]) == ("llama2c", 64, 5, 8, 4)
    assert (c["head_dim"], c["vocab_size"], c["seq_len"]) == (8, 512, 512)
    tok = vq.Tokenizer.load(model, str(TOKENIZER))
    ids = tok.encode("Once upon a time")
    assert ids[0] == 1 and tok.decode(ids) == "Once upon a time"
    assert tok.vocab_size == 512


def test_missing_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nope.bin"
    with pytest.raises(vq.Error) as e:
        vq.Model.load(str(missing))
    assert e.value.code == "file_error"
    assert str(missing) in str(e.value) and e.value.path == str(missing)


def test_generate_matches_the_cli(model, cli):
    method = "streaming_llm:n_sink=4,window_size=12"
    r = vq.generate(model, str(TOKENIZER), prompt="Once upon a time", steps=40, method=method)
    out = subprocess.run(
        [cli, "generate", "--model", str(MODEL), "--tokenizer", str(TOKENIZER), "--prompt",
         "Once upon a time", "--steps", "40", "--method", method],
        check=True, capture_output=True, text=True)
    assert out.stdout == r["text"] + "\n"
    # The CLI's summary line: "generate: 41 tokens (5 prompt incl. BOS, 35 decode steps); ..."
    summary = out.stderr.split("generate: ")[1]
    assert summary.startswith(f"{len(r['ids'])} tokens ({r['n_prompt']} prompt incl. BOS, "
                              f"{r['n_decode']} decode steps)")
    assert r["n_prompt"] == 5  # BOS + "Once upon a time" in 4 tokens
    assert r["cache"]["tokens_kept"] == 16
    assert r["text"].startswith("Once upon a time")


def test_eval_returns_the_cli_result_file(cli, tmp_path):
    methods, budgets = ["full", "streaming_llm", "h2o"], [32]
    args = dict(tokens=96, methods=methods, budgets=budgets)
    res = vq.eval(str(MODEL), str(TEXT), tokenizer=str(TOKENIZER), **args)
    path = tmp_path / "eval.json"
    subprocess.run(
        [cli, "eval", "--model", str(MODEL), "--tokenizer", str(TOKENIZER), "--text", str(TEXT),
         "--tokens", "96", "--budget", "32", "--json", str(path)]
        + sum((["--method", m] for m in methods), []),
        check=True, capture_output=True)
    ref = json.loads(path.read_text())
    assert res["kind"] == ref["kind"] == "eval" and res["schema"] == ref["schema"]
    assert res["settings"] == ref["settings"]
    assert len(res["rows"]) == len(ref["rows"]) == 3
    for a, b in zip(res["rows"], ref["rows"]):
        a, b = dict(a), dict(b)
        a.pop("time_per_token_ms"), b.pop("time_per_token_ms")  # timing, not a result
        assert a == b  # every metric bit-identical (deterministic engine)


def test_run_forced_agrees_with_eval(model):
    tok = vq.Tokenizer.load(model, str(TOKENIZER))
    ids = tok.encode(TEXT.read_text())[:64]
    run = vq.run_forced(model, ids, "full")
    assert run["nll"].shape == (63,) and run["top1"].shape == (63,)
    assert run["ppl"] == pytest.approx(np.exp(run["nll"].mean()), rel=1e-12)
    res = vq.eval(str(MODEL), str(TEXT), tokenizer=str(TOKENIZER), tokens=64, methods=["full"], budgets=[32])
    assert res["rows"][0]["ppl"] == run["ppl"]
    with pytest.raises(vq.Error):
        vq.run_forced(model, ids[:1], "full")


def test_hugging_face_checkpoint_generates_as_the_cli(cli):
    """Every format the engine reads loads from Python: the HF Llama checkpoint (safetensors +
    tokenizer.json) of the shared data, when present."""
    shared = pathlib.Path(os.environ.get("VQ_SHARED_DIR", "")) / "data" / "models" / "tinystories-656K"
    if not (shared / "config.json").exists():
        pytest.skip(f"{shared} not present (shared data)")
    model = vq.Model.load(str(shared))
    assert model.config["format"] == "hf" and model.config["rope"] == "rotate_half"
    r = vq.generate(model, prompt="Once upon a time", steps=24, method="tova:budget=16")
    out = subprocess.run([cli, "generate", "--model", str(shared), "--prompt", "Once upon a time",
                          "--steps", "24", "--method", "tova:budget=16"],
                         check=True, capture_output=True, text=True)
    assert out.stdout == r["text"] + "\n"
