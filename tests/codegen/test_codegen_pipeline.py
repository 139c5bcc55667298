"""Pipelined plans: SplitPipeline first, the root's styles split per stage part, plain DP as HSDP,
what is refused and why, the emitted script; and (slow) that script on 8 gloo processes against one."""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys

import pytest
import torch
from test_codegen_lower import plan
from test_codegen_run import _losses, _reference, _torchrun

from meshplan import ir, zoo
from meshplan.codegen import FullyShard, SplitPipeline, StyleKind, emit_source, lower
from meshplan.runtime.pipeline import Absent, Stage, held, holds


def pipelined(family: str = "llama", *, pp: int = 2, schedule: str = "1f1b", vp: int = 1, stages=None,
              nmb: int = 2, **kw) -> ir.Plan:
    p = plan(family, **kw)
    layers, count = p.model["layers"], pp * vp
    stages = stages or tuple((c * layers // count, (c + 1) * layers // count) for c in range(count))
    return dataclasses.replace(p, mesh=dataclasses.replace(p.mesh, pp=pp), stages=stages, schedule=schedule, vp=vp,
                               micro_batch_size=2, num_microbatches=nmb, global_batch=2 * nmb * p.mesh.dp)


def test_split_first_then_tp_recompute_fsdp_per_stage_part() -> None:
    program = lower(pipelined("gpt", dp=2, tp=2, zero=3, sp=True, recompute=("full", "none", "none", "selective")))
    assert program.mesh.dims == (("pp", 2), ("dp", 2), ("tp", 2))
    assert program.kinds() == ("BuildMesh", "SplitPipeline") + ("TensorParallel",) * 8 + ("Recompute",) * 2 + (
        "FullyShard",) * 5
    split = program.steps[1]
    assert split == SplitPipeline(stages=((0, 2), (2, 4)), schedule="1f1b", vp=1, blocks="layers",
                                  first_parts=("embed.tok", "embed.pos"), last_parts=("norm", "output"),
                                  seq_factor=2) and split.pp_size == 2
    parts = {s.module: dict(s.plan)[""] for s in program.steps[2:6]}
    assert list(parts) == ["embed.tok", "embed", "norm", "output"]  # each runs only on the stage that holds it
    assert parts["embed.tok"].kind == StyleKind.ROWWISE
    assert parts["embed"].kind == StyleKind.PREPARE_OUTPUT  # gpt: R -> S(1) after adding positions
    assert parts["norm"].kind == StyleKind.SEQUENCE_PARALLEL and str(parts["output"]) == "colwise(S(1) -> S(-1), DTensor)"
    shards = [s for s in program.steps if isinstance(s, FullyShard)]
    assert [s.reshard_after_forward for s in shards] == [True] * 4 + [False]


def test_plain_dp_under_pipelining_is_hsdp() -> None:
    """DDP breaks under torch.distributed.pipelining (its shape inference runs a backward DDP does not
    expect); FSDP2 with a shard group of 1 all-reduces once per step, driven by the schedule."""
    program = lower(pipelined("llama", dp=2, schedule="zero-bubble"))
    assert program.mesh.dims == (("pp", 2), ("dp", 2), ("dp_shard", 1))
    assert "DataParallel" not in program.kinds()
    shards = [s for s in program.steps if isinstance(s, FullyShard)]
    assert [s.module for s in shards] == ["layers.0", "layers.1", "layers.2", "layers.3", ""]
    assert all(s.mesh_axes == ("dp", "dp_shard") and not s.reshard_after_forward for s in shards)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dp=2, zero=1), "zero_stage 1 with pp(2) > 1 is not supported"),
    (dict(dp=2, zero=3, schedule="zero-bubble"), "zero_stage 3 with the zero-bubble schedule is not supported"),
    (dict(pp=4, nmb=2), "schedule 1f1b needs num_microbatches(2) >= pp(4)"),
    (dict(pp=2, nmb=5, schedule="interleaved-1f1b", vp=2), "num_microbatches(5) % 2 rounds = 1"),
    (dict(pp=2, nmb=5, schedule="zero-bubble"), "num_microbatches(5) % 2 rounds = 1; use a multiple of 2"),
    (dict(stages=((0, 1), (1, 3))), "plan.stages cover 3 layers but the model has 4"),
])
def test_unsupported_pipelines_say_why(kwargs, message) -> None:
    with pytest.raises(ir.InvalidPlanError) as err:
        lower(pipelined(**kwargs))
    assert message in str(err.value)


def test_split_pipeline_checks_itself() -> None:
    with pytest.raises(ir.InvalidPlanError, match="cover the layers in order"):
        SplitPipeline(stages=((0, 2), (3, 4)), schedule="gpipe")
    with pytest.raises(ir.InvalidPlanError, match=r"do not split into pp ranks of vp\(2\)"):
        SplitPipeline(stages=((0, 1), (1, 2), (2, 4)), schedule="interleaved-1f1b", vp=2)


def test_script_builds_stages_and_the_schedule() -> None:
    src = emit_source(pipelined("llama", dp=2, tp=2, sp=True, zero=2, schedule="interleaved-1f1b", vp=2,
                                stages=((0, 1), (1, 3), (3, 4), (4, 6)), layers=6, recompute=("full",) + ("none",) * 5))
    compile(src, "t.py", "exec")
    assert "from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B" in src
    assert 'mesh = init_device_mesh(device.type, (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))' in src
    assert "    stage_layers = ((0, 1), (1, 3), (3, 4), (4, 6))\n" in src
    assert "    stage_ids = range(pp_rank, len(stage_layers), 2)\n" in src
    assert ("stage_modules = [parallelize(Stage(model, *stage_layers[c], embeds=c == 0, "
            "projects=c == last_stage,") in src
    assert ('stage_parts = {"blocks": "layers", "num_blocks": 6, "first_parts": ("embed.tok",), '
            '"last_parts": ("norm", "output"), "seq_factor": 2, "call_kwargs": {}, "block_tuple": False}') in src
    assert "    tied = TiedWeights(model, mesh" in src and "        tied.all_reduce_grads(model)  #" in src
    assert "model = materialized(LocalStages(stage_modules), mesh)" in src  # built on meta, each rank its shards
    assert "        stages, n_microbatches=NUM_MICROBATCHES, loss_fn=token_cross_entropy)" in src
    assert ('    if holds(model, "embed.tok"):  # only the stage that holds it\n'
            "        parallelize_module(model.embed.tok") in src
    assert "    for i in held(model, range(6)):\n        parallelize_module(model.layers[i]" in src
    assert "    for i in held(model, (0,)):\n        model.layers[i] = checkpoint_wrapper(" in src
    assert "schedule.step(*first_stage_inputs, target=targets.to(device), losses=losses, return_outputs=False)" in src
    single = emit_source(pipelined("gpt", schedule="gpipe"))
    assert "ScheduleGPipe(\n        stages[0], n_microbatches" in single and "DistributedDataParallel" not in single


def test_stage_holds_its_blocks_under_the_whole_models_names() -> None:
    """A stage is the model with the other stages' parts taken out: its own modules (shared, not copied),
    the model's parameter names, and stand-ins (``Absent``) holding nothing where the others' parts are."""
    model = zoo.build("gpt-tiny")
    parts = dict(blocks="layers", num_blocks=4, first_parts=("embed.tok", "embed.pos"), last_parts=("norm", "output"))
    first = Stage(model, 0, 1, embeds=True, projects=False, **parts)
    middle = Stage(model, 1, 3, embeds=False, projects=False, **parts)
    last = Stage(model, 3, 4, embeds=False, projects=True, **parts)
    own = {id(p): n for n, p in model.named_parameters()}
    names = [[n for n, _ in stage.named_parameters()] for stage in (first, middle, last)]
    assert sorted(sum(names, [])) == sorted(own.values())  # each parameter on exactly one stage
    assert all(own[id(p)] == n for stage in (first, middle, last) for n, p in stage.named_parameters())
    assert names[1][0] == "layers.1.attn_norm.weight" and held(middle, range(4)) == [1, 2]
    assert holds(first, "embed") and not holds(middle, "embed") and holds(last, "output")
    assert isinstance(middle.get_submodule("layers.0"), Absent) and model.layers[0] is first.layers[0]
    tokens = torch.randint(0, model.config.vocab, (2, 8))
    torch.testing.assert_close(last(middle(first(tokens))), model(tokens))  # the model's own forward, in three


@pytest.mark.slow
def test_emitted_pp_dp_tp_script_matches_one_process(tmp_path) -> None:
    """pp=2 x dp=2 x tp=2 with SP, ZeRO-3 and recompute, 1F1B, on 8 gloo processes under torchrun."""
    path = tmp_path / "train_3d.py"
    path.write_text(emit_source(pipelined("llama", dp=2, tp=2, sp=True, zero=3,
                                          recompute=("full", "none", "selective", "none"))))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "8", "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(path), "--steps", "3"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    losses = _losses(done.stdout)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference("llama-tiny")), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("pins", [dict(pp=2, dp=2, tp=1, zero=2, num_microbatches=2),
                                  dict(pp=1, dp=2, tp=2, zero=0, num_microbatches=2)], ids=["pp2 x dp2", "dp2 x tp2"])
def test_emitted_script_trains_a_tied_head(tmp_path, pins) -> None:
    """Hugging Face GPT-2 ties its head to the token embedding. Under pp=2 x dp=2 the first stage holds the embedding
    and the last a copy of it as the head (runtime.pipeline.TiedWeights), built on meta and filled from the
    embedding's values, the copies' gradients summed after each backward; under dp=2 x tp=2 both are vocab-parallel,
    one weight (runtime.styles.kept_ties). The emitted script on 4 gloo processes prints one process's losses (AdamW;
    run with --clip-grad for the code path: under Adam a wrong norm barely shows, so that clipping counts the weight
    once is checked with SGD in test_runtime_pretrained)."""
    pytest.importorskip("transformers")
    import meshplan as mp
    import user_models
    from meshplan.runtime.source import build

    source = {"kind": "hf", "class": "GPT2LMHeadModel", "config": user_models.hf_gpt2_config()}
    with torch.device("meta"):
        meta = build(source)
    plan = mp.autoparallelize(meta, "cpu:1x4", global_batch=8, seq_len=16,
                              fixed={**pins, "cp": 1, "micro_batch": 2, "recompute": "none"}, dtype="float32")
    assert plan.structure["tied_head"] and (plan.mesh.pp, plan.mesh.tp) == (pins["pp"], pins["tp"])
    src = emit_source(plan)
    wanted = ('tied = TiedWeights(model, mesh, "pp", stage_parts["first_parts"], stage_parts["last_parts"])'
              if pins["pp"] > 1 else "with kept_ties(model):")
    assert wanted in src
    path = tmp_path / "train_tied.py"
    path.write_text(src)
    clip = 0.5
    losses = _losses(_torchrun([str(path), "--clip-grad", str(clip)], tmp_path))
    want = _hf_reference(source, plan.model["vocab"], len(losses), clip=clip)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), atol=1e-5, rtol=1e-5)


def _hf_reference(source: dict, vocab: int, steps: int, clip: float | None = None) -> list[float]:
    """One process training the Hugging Face model of ``source`` as the emitted scripts do (seed 0, AdamW lr
    1e-3, 8 sequences of 16 tokens a step), clipped to ``clip`` (and checked to clip) if given: its losses."""
    from meshplan.runtime.planned import logits_of, token_cross_entropy
    from meshplan.runtime.source import build
    from meshplan.runtime.train import synthetic_batch

    torch.manual_seed(0)
    net = build(source)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    want = []
    for step in range(1, steps + 1):
        x, y = synthetic_batch(vocab, 8, 16, 0, step)
        loss = token_cross_entropy(logits_of(net(x, use_cache=False)), y)
        loss.backward()
        if clip is not None:
            assert torch.nn.utils.clip_grad_norm_(net.parameters(), clip) > clip  # the case clips
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    return want


@pytest.mark.slow
def test_emitted_pp_cp_script_matches_one_process(tmp_path) -> None:
    """A Hugging Face Llama under pp=2 x cp=2 (ZeRO-2 over dp x cp): each rank cuts its tokens before the
    schedule, every stage's model forward gets their global position_ids (Stage.position_ids, set in the
    loop), and the emitted script on 4 gloo processes prints one process's losses. cp is set by hand: the
    solver keeps >= 1024 tokens per cp rank, more than a test runs."""
    pytest.importorskip("transformers")
    import meshplan as mp
    import user_models
    from meshplan.runtime.source import build

    source = {"kind": "hf", "class": "LlamaForCausalLM", "config": user_models.hf_llama_config(num_hidden_layers=4)}
    with torch.device("meta"):
        meta = build(source)
    plan = mp.autoparallelize(meta, "cpu:1x4", global_batch=8, seq_len=16, dtype="float32",
                              fixed=dict(pp=2, dp=2, tp=1, cp=1, zero=2, micro_batch=2, num_microbatches=2,
                                         recompute="none"))
    plan = dataclasses.replace(plan, mesh=dataclasses.replace(plan.mesh, dp=1, cp=2), micro_batch_size=4)
    src = emit_source(plan)
    assert "module.position_ids = cp_positions" in src
    path = tmp_path / "train_pp_cp.py"
    path.write_text(src)
    losses = _losses(_torchrun([str(path)], tmp_path))
    want = _hf_reference(source, plan.model["vocab"], len(losses))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), atol=1e-5, rtol=1e-5)
