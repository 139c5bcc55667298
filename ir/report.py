"""The plan as text a person reads: a summary line, the parallelism, time and memory per GPU,
the constraint that binds, and (``explain``) the strategies that lost and by how much."""
from __future__ import annotations

from .plan import AXES, Plan

GB = 1e9


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _row(label: str, value: str, note: str = "") -> str:
    return f"  {label:<22}{value:>14}  {note}".rstrip()


def report(plan: Plan) -> str:
    name = plan.model.get("name") or plan.model.get("family", "model")
    lines = [f"meshplan: {name} on {plan.cluster} ({plan.world_size} GPUs), global batch {plan.global_batch} "
             f"x {plan.seq_len} tokens", f"plan: {plan.summary()}", *_model_lines(plan)]
    if plan.software != "meshplan":
        lines.append(f"costed as: {plan.software}'s program, {plan.dtype} (take it there with `meshplan export`; "
                     "emit and run execute meshplan's runtime)")
    lines += ["", "parallelism"]
    for axis in AXES:
        lines.append(_row(axis, str(getattr(plan.mesh, axis)), _axis_note(plan, axis)))
    lines.append(_row("zero stage", str(plan.zero_stage), _zero_note(plan.zero_stage)))
    lines.append(_row("micro-batch", f"{plan.micro_batch_size} x {plan.num_microbatches}",
                      "size x count per data-parallel rank"))
    counts = {r: plan.recompute.count(r) for r in dict.fromkeys(plan.recompute)}
    lines.append(_row("recompute", ", ".join(f"{n} {r}" for r, n in counts.items()) or "none", "layers"))
    if plan.mesh.pp > 1:
        lines.append(_row("pipeline", f"{plan.schedule}", f"stages {list(plan.stages)}"))
    if plan.fusions:
        lines.append(_row("fused kernels", str(len(plan.fusions)), f"{', '.join(plan.fusions)}: {_fusion_note(plan)}"))
    pred = plan.prediction
    if pred is not None:
        lines += ["", "time per step"] + _time_rows(pred) + ["", "memory per GPU (the most loaded)"]
        lines += _memory_rows(pred)
        lines += ["", "throughput",
                  _row("tokens/s", f"{pred.tokens_per_s:,.0f}"),
                  _row("model TFLOP/s/GPU", f"{pred.model_tflops_per_gpu:.3g}", f"MFU {pred.mfu:.1%}"),
                  _row("hardware TFLOP/s/GPU", f"{pred.hardware_tflops_per_gpu:.3g}", "recompute counted")]
    if plan.solver is not None:
        s = plan.solver
        lines += ["", f"solver: {s.status}, gap {s.gap:.2%}, {s.wall_s:.2f} s; {s.candidates} candidates, "
                  f"{s.pruned} pruned (cannot fit); ILP {s.variables} variables, {s.constraints} constraints"]
        if s.phases:
            lines.append("phases: " + ", ".join(f"{name} {sec:.2f} s" for name, sec in s.phases.items()))
        if s.intra_op:
            lines.append(f"intra-op: {s.intra_op}; ILP {s.intra_op_variables} variables, "
                         f"{s.intra_op_constraints} constraints")
        if s.binding:
            lines.append(f"binding constraint: {s.binding}")
    return "\n".join(lines)


def _model_lines(plan: Plan) -> list[str]:
    """Where the model comes from, its blocks as the frontend found them, and what it could not use."""
    src, st = plan.source, plan.structure
    if not src and not st:
        return []
    kind = src.get("kind", "")
    origin = {"zoo": "meshplan zoo", "hf": f"Hugging Face {src.get('class') or 'model'}",
              "builder": f"builder {src.get('target')}", "module": "the caller's module"}.get(kind, kind)
    blocks = f"{st.get('num_blocks', 0)} blocks in {st['blocks']!r}" if st.get("blocks") else "no repeated blocks"
    lines = [f"model: {origin}; {blocks}"]
    lines += [f"  note: {note}" for note in st.get("notes", ())]
    return lines


def _time_rows(pred) -> list[str]:
    rows = [_row("step", f"{pred.step_time_s * 1e3:.1f} ms")]
    kinds = (("compute", "compute", ""), ("exposed_comm", "exposed comm", ""), ("bubble", "pipeline bubble", ""))
    if "unpriced" in pred.time_s:  # what the accelerator's published runs spent beyond the priced step
        kinds += (("unpriced", "unpriced", " (calibrated on published runs: Accelerator.calibration)"),)
    for key, label, why in kinds:
        value = pred.time_s.get(key, 0.0)
        rows.append(_row(label, f"{value * 1e3:.1f} ms", f"{value / pred.step_time_s:.0%}{why}"))
    return rows


def _memory_rows(pred) -> list[str]:
    rows = []
    for key in ("params", "grads", "optimizer", "activations", "buffers"):
        note = "those held when activations peak" if key == "grads" else ""
        rows.append(_row(key, _bytes(pred.memory_bytes[key]), note))
    limit = pred.memory_limit_bytes
    note = f"of {limit / GB:.1f} GB ({pred.peak_memory_bytes / limit:.0%})" if limit else ""
    rows.append(_row("peak", _bytes(pred.peak_memory_bytes), note))
    return rows


def _fusion_note(plan: Plan) -> str:
    """The saving the prediction counts (the unfused program is an alternative), and how to get it."""
    unfused = next((a for a in (plan.solver.alternatives if plan.solver else ()) if a.get("fuse") is False), None)
    how = "(emit and apply fuse by default; --no-fuse / apply(fuse=False) runs eager)"
    if unfused is None or plan.prediction is None:
        return how
    return f"save {(unfused['step_time_s'] - plan.prediction.step_time_s) * 1e3:.1f} ms/step {how}"


def _axis_note(plan: Plan, axis: str) -> str:
    return {"pp": "pipeline stages", "dp": "data-parallel replicas", "cp": "context (sequence) shards",
            "tp": "tensor-parallel shards" + (" + sequence parallel" if plan.sequence_parallel else ""),
            "ep": ("expert shards over tp x dp x cp, each expert whole" if plan.mesh.ep_over_tp
                   else "expert shards (inside dp x cp)")}[axis]


def _zero_note(stage: int) -> str:
    return ("replicated states", "optimizer states sharded over dp", "optimizer states + gradients sharded",
            "optimizer states + gradients + parameters sharded (FSDP)")[stage]


def explain(plan: Plan) -> str:
    """The runners-up the solver found and why each lost."""
    lines = [f"chosen: {plan.summary()}"]
    if plan.prediction is not None:
        lines[0] += (f"  ({plan.prediction.step_time_s * 1e3:.1f} ms/step, "
                     f"{plan.prediction.peak_memory_bytes / GB:.1f} GB)")
    alts = plan.solver.alternatives if plan.solver else ()
    if not alts:
        lines.append("no alternatives recorded (everything was pinned, or only one strategy fits)")
    for i, alt in enumerate(alts, 2):
        lines.append(f"#{i}: {alt['summary']}  ({alt['step_time_s'] * 1e3:.1f} ms/step, "
                     f"{alt['peak_memory_bytes'] / GB:.1f} GB): {alt['why']}")
    return "\n".join(lines)
