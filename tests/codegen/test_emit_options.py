"""Emitted scripts take ``meshplan run``'s --clip-grad, --compile and --init-from (codegen/options.py).

Text checks: the flags are parsed, clipping sits between the last backward and ``optimizer.step()``
(with the pp group under pipeline parallelism), compiling between the build and ``parallelize``, loading
after materialization. A flag the model cannot take exits 2 in one line before any process group.
The slow check runs an emitted Hugging Face Llama script on 4 gloo processes with --init-from and
--clip-grad and compares its losses with transformers' own model clipped by torch in one process, and
with ``meshplan run`` of the same plan, line for line."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from meshplan.codegen import emit_source
from test_codegen_lower import plan
from test_codegen_pipeline import pipelined

FLAGS = ('parser.add_argument("--clip-grad", type=float', 'parser.add_argument("--compile", action="store_true"',
         'parser.add_argument("--init-from", metavar="DIR"')


def _between(text: str, first: str, then: str) -> bool:
    return first in text and then in text and text.index(first) < text.index(then)


def test_zoo_script_parses_the_flags_and_clips_before_the_step() -> None:
    src = emit_source(plan("gpt", dp=2, tp=2, zero=3, sp=True, nmb=2))
    assert all(flag in src for flag in FLAGS)
    assert _between(src, "loss.backward()", "clip_grad_norm_(model, args.clip_grad)\n")
    assert _between(src, "clip_grad_norm_(model, args.clip_grad)", "optimizer.step()")
    assert _between(src, "build_on_meta(", "compile_blocks(model, BLOCKS)")
    assert _between(src, "compile_blocks(model, BLOCKS)", "model = materialized(parallelize(model, mesh), mesh)")
    assert 'BLOCKS = "layers"' in src
    # a zoo model's names are not a transformers checkpoint's: refused, never loaded
    assert "load_pretrained_into" not in src and "--init-from loads a Hugging Face checkpoint" in src


def test_pipelined_script_clips_over_the_pp_group() -> None:
    src = emit_source(pipelined("llama", dp=2, schedule="gpipe"))
    assert all(flag in src for flag in FLAGS)
    clip = "clip_grad_norm_(model, args.clip_grad, pp_group)"  # a tied head's copy counted once (model.tied_copies)
    assert _between(src, "schedule.step(", "tied.all_reduce_grads(model)") and _between(src, "tied.all_reduce", clip)
    assert _between(src, clip, "optimizer.step()")
    assert _between(src, "compile_blocks(model, BLOCKS)", "stage_modules = [parallelize(Stage(")


def test_hf_script_loads_the_checkpoint_after_materialization() -> None:
    pytest.importorskip("transformers")
    hf = _hf_plan(dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2)
    src = emit_source(hf)
    assert all(flag in src for flag in FLAGS)
    assert _between(src, "model = materialized(parallelize(model, mesh), mesh)",
                    "load_pretrained_into(model, args.init_from)")
    assert _between(src, "load_pretrained_into(model, args.init_from)", "optimizer = ")
    assert _between(src, "args = parser.parse_args()", "find_safetensors(args.init_from)")
    assert 'BLOCKS = "model.layers"' in src


@pytest.mark.parametrize("flags, want", [
    (["--init-from", "somewhere"], r"--init-from loads a Hugging Face checkpoint .* built by the meshplan zoo"),
    (["--clip-grad", "-1"], r"--clip-grad is -1.0 but must be a positive finite number"),
])
def test_a_flag_the_script_cannot_take_exits_2_in_one_line(tmp_path, flags, want) -> None:
    script = tmp_path / "train.py"
    script.write_text(emit_source(plan("gpt", dp=2)))
    done = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and re.search(want, done.stderr), done.stderr
    assert done.stdout == ""


def test_compile_is_refused_for_the_programs_torch_cannot_compile(tmp_path) -> None:
    """--compile of each block fails on torch 2.13 under tp with selective recomputation (AOT autograd's forward
    stops) and trains other weights under the zero-bubble schedule (pytorch/pytorch#161904): both are refused,
    saying what to plan instead, by meshplan run (``Options.check``) and by the emitted script; the programs
    beside them compile (their parity cases: tests/runtime/test_runtime_parity.py, test_runtime_pipeline.py)."""
    from meshplan.codegen import lower
    from meshplan.codegen.options import compile_refusal
    from meshplan.ir import PlanError
    from meshplan.runtime.train import Options

    sel = ("selective",) * 4
    refused = {"tp selective": plan("llama", dp=2, tp=2, recompute=sel),
               "zero bubble": pipelined("llama", dp=2, schedule="zero-bubble")}
    allowed = [plan("llama", dp=4, recompute=sel), plan("llama", dp=2, tp=2, recompute=("full",) * 4),
               pipelined("llama", dp=2), pipelined("llama", dp=2, schedule="interleaved-1f1b", vp=2)]
    want = {"tp selective": r"selective recomputation under tensor parallelism .* --recompute full or none",
            "zero bubble": r"zero-bubble pipeline schedule .* --schedule 1f1b or interleaved-1f1b"}
    for name, p in refused.items():
        assert re.search(want[name], compile_refusal(lower(p)) or ""), name
        with pytest.raises(PlanError, match=want[name]):
            Options(compile=True).check(p)
        Options().check(p)  # without --compile: nothing to refuse
        script = tmp_path / "train.py"
        script.write_text(emit_source(p))
        done = subprocess.run([sys.executable, str(script), "--compile"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and re.search(want[name], done.stderr), done.stdout + done.stderr
    assert [compile_refusal(lower(p)) for p in allowed] == [None] * len(allowed)


CLIP = 0.5
STEPS = 3


def _hf_plan(**fixed):
    import meshplan as mp
    import user_models
    from meshplan.runtime.source import build

    source = {"kind": "hf", "class": "LlamaForCausalLM", "config": user_models.hf_llama_config()}
    with torch.device("meta"):
        model = build(source)
    return mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=16,
                              fixed=dict(pp=1, cp=1, ep=1, sp=False, recompute="none", **fixed))


def _reference(checkpoint: Path, seed: int) -> list[float]:
    """transformers' model from ``checkpoint``, AdamW lr 1e-3 (the script's), clipped by torch."""
    from transformers import LlamaForCausalLM

    from meshplan.runtime.planned import token_cross_entropy
    from meshplan.runtime.train import synthetic_batch

    model = LlamaForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(1, STEPS + 1):
        x, y = synthetic_batch(model.config.vocab_size, 8, 16, seed, step)
        loss = token_cross_entropy(model(input_ids=x, use_cache=False).logits, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
        assert norm > CLIP  # the case really clips
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _run(cmd: list[str], cwd: Path) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.slow
def test_emitted_hf_script_with_init_from_and_clip_grad_matches_meshplan_run(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    import user_models

    torch.manual_seed(123)  # not the script's seed: the loss shows that the checkpoint was loaded
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**user_models.hf_llama_config())).save_pretrained(
        tmp_path / "llama")
    hf = _hf_plan(dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2)
    script = hf.emit(tmp_path / "train_hf.py")
    plan_file = hf.save(tmp_path / "plan.json")
    options = ["--steps", str(STEPS), "--init-from", str(tmp_path / "llama"), "--clip-grad", str(CLIP)]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from_script = _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr",
                        "127.0.0.1", "--master-port", str(port), str(script), *options], tmp_path)
    lines = re.findall(r"^step \d+ loss \S+$", from_script, re.M)
    assert len(lines) == STEPS, from_script
    losses = [float(line.split()[-1]) for line in lines]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference(tmp_path / "llama", seed=0)),
                               atol=2e-5, rtol=1e-5)
    from_run = _run([sys.executable, "-m", "meshplan.cli", "run", str(plan_file), "--nproc", "4", *options], tmp_path)
    assert re.findall(r"^step \d+ loss \S+$", from_run, re.M) == lines  # the very same printed lines
