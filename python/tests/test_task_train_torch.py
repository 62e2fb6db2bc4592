"""The task model's trainer (scripts/train/, PyTorch) end to end on a CPU-sized run, and its export
against the engine. Skipped where PyTorch is not installed (CI); test_task_train.py holds the
torch-free check of the export (a committed fixture)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (Debian: python3-torch); the trainer's tests need "
    "it, and test_task_train.py checks the export without it")

import veloxquant as vq  # noqa: E402
from conftest import DATA, SOURCE_DIR, TOKENIZER  # noqa: E402

sys.path.insert(0, str(SOURCE_DIR / "scripts" / "train"))
import tasklib as T  # noqa: E402
import make_fixture  # noqa: E402
from model import Llama, export_llama2c, load_llama2c  # noqa: E402


def engine_nll(path, ids):
    return vq.run_forced(vq.Model.load(str(path)), ids, "full:kv_dtype=f32")


def torch_nll(model, ids):
    with torch.no_grad():
        lg = model(torch.tensor([ids])).double()[0]
    tgt = torch.tensor(ids[1:])
    return (torch.logsumexp(lg[:-1], -1) - lg[torch.arange(len(ids) - 1), tgt]).numpy(), lg


def test_committed_fixture_is_what_the_exporter_writes(tmp_path):
    m, ids = make_fixture.build()
    export_llama2c(m, str(tmp_path / "f.bin"))
    ref = DATA / "reference"
    assert (tmp_path / "f.bin").read_bytes() == (ref / "task_model_fixture.bin").read_bytes(), \
        "rerun scripts/train/make_fixture.py"
    assert ids == [int(x) for x in (ref / "task_model_fixture.ids.txt").read_text().split()]
    want = np.fromfile(ref / "task_model_fixture.logits.f32", dtype="<f4").reshape(len(ids), -1)
    got = make_fixture.logits64(m, ids).numpy()
    assert np.abs(got - want).max() < 1e-5


def test_rope_convention_is_what_the_engine_computes(tmp_path):
    # Negative control: the same weights with the other RoPE pairing (rotate_half, Hugging Face)
    # give NLLs far outside the tolerance the export checks use, so those checks can fail.
    import model as model_module
    m, ids = make_fixture.build()
    path = tmp_path / "f.bin"
    export_llama2c(m, str(path))
    got = engine_nll(path, ids)["nll"]
    want, _ = torch_nll(m, ids)
    assert np.abs(got - want).max() < 1e-4
    saved = model_module.apply_rope

    def rotate_half(x, cos, sin):
        x0, x1 = x.chunk(2, dim=-1)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)

    try:
        model_module.apply_rope = rotate_half
        other, _ = torch_nll(m, ids)
    finally:
        model_module.apply_rope = saved
    assert np.abs(got - other).max() > 1e-2


def test_tiny_training_run_exports_a_model_the_engine_runs(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(SOURCE_DIR / "scripts" / "train" / "train_task_model.py"),
           "--out", str(out), "--device", "cpu", "--steps", "4", "--workers", "0",
           "--dim", "64", "--hidden-dim", "128", "--n-layers", "2", "--n-heads", "2",
           "--n-kv-heads", "1", "--lengths", "512", "--length-weights", "1",
           "--tokens-per-batch", "2048", "--eval-lengths", "512", "--eval-samples", "2",
           "--log-every", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "task_model.json").read_text())
    assert report["status"] == "done" and report["steps"] == 4
    assert report["tokens"] == 4 * (2048 // (512 + 48)) * (512 + 48)
    assert [p["step"] for p in report["loss_curve"]] == [2, 4]
    assert len(report["heldout"]) == 4 and all(h["n"] == 2 for h in report["heldout"])
    assert report["data"]["train_text"]["sha256"] == T.sha256_file(
        str(DATA / "tasks" / "tinystories_train.txt"))
    path = out / "task_model.bin"
    assert report["model_file"]["sha256"] == T.sha256_file(str(path))
    c = vq.Model.load(str(path)).config
    assert (c["dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"], c["seq_len"]) == (64, 2, 2, 1, 640)
    # The exported file read back is the same network, and the engine computes what torch does
    # on a generated prompt.
    m = load_llama2c(str(path))
    tok = T.Tok512(str(TOKENIZER))
    words = T.read_words(str(DATA / "tasks" / "words.txt"))
    gen = T.TaskGenerator(tok, words, (DATA / "tasks" / "tinystories_train.txt").read_text(encoding="utf-8"))
    s = gen.sample(T.sample_rng("pytest", 0, "export", 0), "niah_multikey", "last", "essay", 400)
    ids = s["prompt_ids"] + s["completion_ids"]
    want, lg = torch_nll(m, ids)
    got = engine_nll(path, ids)
    assert np.abs(got["nll"] - want).max() < 1e-4
    top2 = lg[:-1].topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]).numpy() > 1e-3  # argmax is only compared off near-ties
    assert (got["top1"] == lg[:-1].argmax(-1).numpy())[clear].all()


def test_trainer_rejects_a_length_too_short_for_a_task(tmp_path):
    cmd = [sys.executable, str(SOURCE_DIR / "scripts" / "train" / "train_task_model.py"),
           "--out", str(tmp_path / "run"), "--device", "cpu", "--lengths", "192",
           "--length-weights", "1", "--tasks", "niah_multivalue"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "--lengths: 192 tokens is too short for niah_multivalue" in r.stderr
    assert not (tmp_path / "run").exists()  # nothing written
    cmd[cmd.index("192")] = "512"
    r = subprocess.run(cmd + ["--eval-lengths", "256"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "--eval-lengths: 256 tokens is too short for the held-out niah_multikey" in r.stderr
