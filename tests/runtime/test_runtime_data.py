"""Real data: flat token files (nanoGPT's raw uint16, Megatron's .bin with its .idx), memory-mapped.

Without processes: the dtype a file is read with, windows and wrap-around, each dp rank's rows being
its slice of the global batch, and the errors for a missing file, a ragged one, ids past the vocabulary.

Through ``meshplan run`` on 2 processes (gpt-tiny, dp2 ZeRO-3): ``--data`` trains on the file's tokens
(the losses are one process's on the same windows, not the synthetic stream's), and a run killed
before step 3 under ``--max-restarts 1`` resumes from its step-2 checkpoint, which stores the data
position, and ends with the uninterrupted run's losses and parameters. Bad input exits 2 with one line
before torchrun starts."""
from __future__ import annotations

import dataclasses
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from meshplan import zoo
from meshplan.runtime.data import DataError, TokenFile, TokenStream, step_batch, token_dtype
from meshplan.runtime.train import synthetic_batch
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, free_port, make_plan

TOTAL = 4
VOCAB = zoo.config("gpt-tiny").vocab


def _write(path: Path, tokens: np.ndarray) -> Path:
    tokens.tofile(path)
    return path


def _corpus(n: int, vocab: int = VOCAB, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.uint16)


def test_the_dtype_comes_from_a_megatron_index_or_the_vocabulary(tmp_path) -> None:
    raw = _write(tmp_path / "train.bin", _corpus(100))
    assert token_dtype(raw, 50257) == torch.uint16  # nanoGPT's GPT-2 tokens
    assert token_dtype(raw, 128256) == torch.uint32  # a Llama 3 vocabulary does not fit in 16 bits
    assert token_dtype(raw, 50257, "int32") == torch.int32
    # Megatron's _IndexWriter: magic, version <Q, dtype code <B (4 = int32)
    (tmp_path / "train.idx").write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4))
    assert token_dtype(raw, 50257) == torch.int32
    with pytest.raises(DataError, match="--data-dtype is 'float32' but must be one of uint16, uint32, int32"):
        token_dtype(raw, 50257, "float32")


def test_windows_overlap_by_one_token_and_wrap_around(tmp_path) -> None:
    tokens = np.arange(41, dtype=np.uint16)
    file = TokenFile.open(_write(tmp_path / "t.bin", tokens), vocab=100)
    assert file.windows(10) == 4  # (41 - 1) // 10
    rows = file.rows(3, 2, 10)  # window 3, then window 0 again
    assert rows.dtype == torch.int64
    assert rows[0].tolist() == list(range(30, 41)) and rows[1].tolist() == list(range(0, 11))


def test_each_dp_rank_reads_its_slice_of_the_global_batch(tmp_path) -> None:
    file = TokenFile.open(_write(tmp_path / "t.bin", _corpus(5000)), vocab=VOCAB)
    whole = TokenStream(file, GLOBAL_BATCH, SEQ_LEN)
    parts = [TokenStream(file, GLOBAL_BATCH, SEQ_LEN, dp_rank=r, dp_size=4) for r in range(4)]
    for step in (1, 2, 3):
        x, y = whole.next_batch()
        got = [p.next_batch() for p in parts]
        torch.testing.assert_close(torch.cat([g[0] for g in got]), x, rtol=0, atol=0)
        torch.testing.assert_close(torch.cat([g[1] for g in got]), y, rtol=0, atol=0)
        torch.testing.assert_close(x[:, 1:], y[:, :-1], rtol=0, atol=0)  # targets are the next tokens
        torch.testing.assert_close(step_batch(file, step, GLOBAL_BATCH, SEQ_LEN, 1, 4)[0], got[1][0], rtol=0, atol=0)
    assert whole.position == 3 * GLOBAL_BATCH


def test_bad_files_are_named(tmp_path) -> None:
    with pytest.raises(DataError, match=r"--data \S+nope.bin does not exist; .*omit --data"):
        TokenFile.open(tmp_path / "nope.bin", vocab=VOCAB)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(DataError, match=r"has 3 bytes, not a whole number of uint16 tokens \(2 bytes each\)"):
        TokenFile.open(tmp_path / "odd.bin", vocab=VOCAB)
    tokens = _corpus(3000)
    tokens[2345] = VOCAB + 5
    file = TokenFile.open(_write(tmp_path / "big.bin", tokens), vocab=VOCAB)
    with pytest.raises(DataError, match=rf"holds token id {VOCAB + 5} at token 2345, but the model's vocabulary "
                                        rf"has {VOCAB} ids \(0\.\.{VOCAB - 1}\)"):
        file.check(GLOBAL_BATCH, SEQ_LEN)
    short = TokenFile.open(_write(tmp_path / "short.bin", _corpus(50)), vocab=VOCAB)
    with pytest.raises(DataError, match=rf"holds 50 tokens but one step needs at least {GLOBAL_BATCH * SEQ_LEN + 1}"):
        short.check(GLOBAL_BATCH, SEQ_LEN)


# ---- through meshplan run (2 processes) -----------------------------------------------------------

def _run(plan_path: Path, *extra: str, env: dict | None = None, timeout_s: float = 400) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "meshplan.cli", "run", str(plan_path), "--nproc", "2", "--steps", str(TOTAL), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout_s)
    return proc.returncode, proc.stdout, proc.stderr


def _losses(out: str) -> dict[int, float]:
    return {int(s): float(x) for s, x in re.findall(r"^step (\d+) loss (\S+)$", out, re.M)}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("data")
    plan = tmp / "plan.json"
    plan.write_text(dataclasses.replace(make_plan("gpt-tiny", dp=2, zero=3), cluster="cpu:1x2").to_json())
    # 3 steps' worth of windows and a bit: step 4 wraps around to the file's start
    return {"plan": plan, "data": _write(tmp / "train.bin", _corpus(3 * GLOBAL_BATCH * SEQ_LEN + 40))}


def _reference(data: Path) -> list[float]:
    """One process, the whole batch, the file's windows in order; AdamW lr 1e-3 as ``meshplan run``."""
    torch.manual_seed(SEED)
    net = zoo.build("gpt-tiny")
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    file = TokenFile.open(data, VOCAB)
    losses = []
    for step in range(1, TOTAL + 1):
        x, y = step_batch(file, step, GLOBAL_BATCH, SEQ_LEN, 0, 1)
        loss = zoo.loss_fn(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_a_killed_run_resumes_the_same_token_stream(files, tmp_path) -> None:
    final, straight_final = tmp_path / "final.pt", tmp_path / "straight.pt"
    code, out, err = _run(files["plan"], "--data", str(files["data"]), "--save-final", str(straight_final))
    assert code == 0, out + err
    straight = _losses(out)
    ref = _reference(files["data"])
    assert list(straight.values()) == pytest.approx(ref, abs=1e-5)
    assert straight[1] != pytest.approx(_first_synthetic_loss(), abs=1e-3)  # not the synthetic stream

    crash = {"MESHPLAN_FAIL_AT_STEP": "3", "MESHPLAN_FAIL_RANK": "1"}
    code, out, err = _run(files["plan"], "--data", str(files["data"]), "--checkpoint-every", "2",
                          "--checkpoint-dir", str(tmp_path / "ckpt"), "--max-restarts", "1",
                          "--save-final", str(final), env=crash)
    assert code == 0, out + err
    assert "injected failure before step 3" in out, out
    assert f"at step 2, token window {2 * GLOBAL_BATCH}" in out, out
    assert _losses(out) == pytest.approx(straight, abs=1e-6)
    ref_params, params = torch.load(straight_final), torch.load(final)
    for name, want in ref_params.items():
        torch.testing.assert_close(params[name], want, atol=1e-6, rtol=1e-6, msg=lambda m: f"{name}: {m}")


def _first_synthetic_loss() -> float:
    torch.manual_seed(SEED)
    net = zoo.build("gpt-tiny")
    x, y = synthetic_batch(VOCAB, GLOBAL_BATCH, SEQ_LEN, SEED, 1)
    return zoo.loss_fn(net(x), y).item()


@pytest.mark.parametrize("case", ["missing", "past the vocabulary"])
def test_bad_data_exits_2_with_one_line_before_torchrun(files, tmp_path, case) -> None:
    if case == "missing":
        path, want = tmp_path / "missing.bin", r"--data \S+missing.bin does not exist"
    else:
        tokens = _corpus(1000)
        tokens[777] = VOCAB
        path, want = _write(tmp_path / "wide.bin", tokens), rf"holds token id {VOCAB} at token 777"
    code, out, err = _run(files["plan"], "--data", str(path), timeout_s=60)
    assert code == 2, out + err
    assert len(err.strip().splitlines()) == 1 and re.search(rf"^meshplan: error: .*{want}", err), err
    assert "Traceback" not in err and out == ""


@pytest.mark.slow
def test_the_emitted_script_reads_the_same_tokens(files, tmp_path) -> None:
    from meshplan import ir
    from meshplan.codegen import emit_source

    script = tmp_path / "train_gpt.py"
    script.write_text(emit_source(ir.Plan.load(files["plan"])))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
                           str(script), "--steps", str(TOTAL), "--data", str(files["data"])],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(_losses(proc.stdout).values()) == pytest.approx(_reference(files["data"]), abs=1e-5)


@pytest.mark.slow
def test_compile_builds_each_block_and_runs_a_step(files) -> None:
    import shutil

    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("torch.compile on CPU needs a C++ compiler (inductor's CPU backend); none is on PATH")
    code, out, err = _run(files["plan"], "--compile", "--clip-grad", "1.0", "--data", str(files["data"]),
                          "--steps", "1", timeout_s=900)
    assert code == 0, out[-3000:] + err[-3000:]
    # a compiled block computes what the eager one does: the first loss is one process's
    assert _losses(out)[1] == pytest.approx(_reference(files["data"])[0], abs=1e-4)
