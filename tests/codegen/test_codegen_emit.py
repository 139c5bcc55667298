"""emit_source: readable scripts that compile and say what the plan says; step grouping into loops."""
from __future__ import annotations

import dataclasses

from test_codegen_lower import plan

from meshplan import ir
from meshplan.codegen import EMITTERS, STEP_KINDS, emit_source, lower
from meshplan.codegen.emit import group_steps, module_expr


def test_every_step_kind_has_an_emitter() -> None:
    assert set(EMITTERS) == set(STEP_KINDS)


def test_module_paths_print_as_attribute_and_index_access() -> None:
    assert module_expr("") == "model"
    assert module_expr("layers.3.attn") == "model.layers[3].attn"
    assert module_expr("layers.{i}") == "model.layers[i]"


def test_per_layer_steps_group_into_loops() -> None:
    program = lower(plan("gpt", dp=2, tp=2, zero=3, recompute=("full", "full", "none", "selective")))
    groups = [(type(step).__name__, getattr(step, "module", None), idx) for step, idx in group_steps(program.steps)]
    assert groups == [
        ("BuildMesh", None, None), ("TensorParallel", "", None), ("TensorParallel", "layers.{i}", (0, 1, 2, 3)),
        ("Recompute", "layers.{i}", (0, 1)), ("Recompute", "layers.{i}.attn", (3,)),
        ("FullyShard", "layers.{i}", (0, 1, 2, 3)), ("FullyShard", "embed.tok", None), ("FullyShard", "output", None),
        ("FullyShard", "", None)]


def test_zero3_tp_script_reads_like_a_recipe() -> None:
    src = emit_source(plan("gpt", dp=2, tp=2, zero=3, sp=True, nmb=2, recompute=("full",) * 4))
    compile(src, "t.py", "exec")
    assert src.startswith('"""Train gpt-tiny with the meshplan plan: dp=2 x tp=2, zero-3, sp')
    assert 'mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))' in src
    assert '"attn.wo": RowwiseParallel(output_layouts=Shard(1)),' in src
    # the logits stay sharded over the vocabulary for the vocab-parallel loss (runtime.loss)
    assert '"output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),' in src
    assert "    for i in range(4):\n        parallelize_module(model.layers[i], mesh[\"tp\"], {" in src
    assert "model.layers[i] = checkpoint_wrapper(" in src
    assert 'fully_shard(model.layers[i], mesh=mesh["dp"], reshard_after_forward=True)' in src
    assert 'fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)' in src
    # TP, then checkpointing, then FSDP, as torchtitan orders them
    assert src.index("parallelize_module(") < src.index("= checkpoint_wrapper(") < src.index("fully_shard(")
    assert "DistributedDataParallel" not in src and "no_sync" not in src
    assert "torch.manual_seed(args.seed)" in src and 'print(f"step {step} loss {loss:.6f}"' in src


def test_plain_dp_script_uses_ddp_and_accumulates_locally() -> None:
    src = emit_source(plan("llama", dp=4, nmb=2))
    compile(src, "t.py", "exec")
    assert ('model = DistributedDataParallel(model, process_group=mesh["dp"].get_group(), gradient_as_bucket_view=True)'
            in src)
    assert "model.no_sync()" in src and "import contextlib" in src
    assert "parallelize_module" not in src and "fully_shard" not in src  # only the imports it uses


def test_hsdp_script_turns_gradient_sync_off_until_the_last_micro_batch() -> None:
    src = emit_source(plan("gpt", dp=2, tp=2, zero=0, nmb=2))
    assert 'mesh=mesh["dp", "dp_shard"]' in src
    assert "model.set_requires_gradient_sync(mb == NUM_MICROBATCHES - 1)" in src


def test_selective_recompute_and_zero1_print_their_helpers() -> None:
    src = emit_source(plan("gpt", dp=4, zero=1, recompute=("selective",) * 4))
    compile(src, "t.py", "exec")
    assert "torch.ops.aten.mm.default," in src and "create_selective_checkpoint_contexts" in src
    assert "model.layers[i].attn = checkpoint_wrapper(" in src and "context_fn=selective_context" in src
    assert "ZeroRedundancyOptimizer(\n        model.parameters(), optimizer_class=torch.optim.AdamW" in src


def test_header_shows_the_prediction() -> None:
    prediction = ir.Prediction(step_time_s=0.25, tokens_per_s=1.0, model_tflops_per_gpu=1.0,
                               hardware_tflops_per_gpu=1.0, mfu=0.41, peak_memory_bytes=3 * 2**30,
                               memory_bytes=dict(params=1, grads=1, optimizer=1, activations=1, buffers=1),
                               time_s=dict(compute=1, exposed_comm=0, bubble=0))
    src = emit_source(dataclasses.replace(plan("gpt", dp=2), prediction=prediction))
    assert "predicted: step time 0.25 s, memory per GPU 3.00 GiB, MFU 41.0%" in src
    assert "torchrun --nproc-per-node 2" in src


def test_one_process_script_has_nothing_to_split() -> None:
    src = emit_source(plan("moe"))
    compile(src, "t.py", "exec")
    assert "pass  # one process: nothing to split" in src
