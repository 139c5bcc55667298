"""Lowering context parallelism (mesh.cp > 1), and how its steps and its script parts print.

    BuildMesh                        ("dp", dp) [("dp_shard", 1)] ("cp", cp) [("tp", tp)]: ranks pp, dp, cp, tp
    FlattenMesh(dp, cp -> dp_cp)     right after the mesh: the ranks that see different tokens
    TensorParallel(...)              as without cp: tp splits the heads of each cp rank's tokens (with sp,
                                     each cp rank's tokens are split further over tp: seq % (cp * tp) == 0)
    ContextParallel(<block>.<attn>)  after tensor parallelism, before recompute (which wraps attn): the zoo's
                                     attention, or any attention that calls SDPA (the model takes position_ids)
    ContextParallel(embed)           zoo gpt only: its learned positions become the tokens' global ones
    Recompute(...)                   as without cp
    FullyShard | DataParallel | ShardOptimizer   over "dp_cp" instead of "dp"

Each cp rank holds ``seq_len / cp`` tokens of every sequence and runs every layer on them; attention,
the one place tokens meet, all-gathers K and V over cp (Llama 3, Dubey et al. 2024, sec. 3.3.2).
With ``load_balance`` (when ``seq_len`` divides by ``2 cp``) rank ``r`` holds chunks ``r`` and
``2cp - 1 - r`` of ``2cp``, so every rank does the same causal work; else chunk ``r`` of ``cp``.

Gradients: every (dp, cp) rank computes the mean loss over its own tokens, and these are equal
shares of the global batch, so data parallelism over the flattened dp x cp ranks (torchtitan's
``dp_shard_cp``) averages gradients into exactly the one-process gradient (the arithmetic:
``meshplan.runtime.context``). The runtime back end is ``meshplan.runtime.context``; PyTorch's own
``context_parallel`` has no CPU attention (see there).

Under pipeline parallelism each rank cuts its tokens before the schedule runs, so every stage runs on
its cp rank's share and hands on ``seq_len / cp`` tokens; a stage's model forward gets the global
``position_ids`` of those tokens (``Stage.position_ids``) where the model takes them. Beside expert
parallelism an expert shard is data-parallel over edp x cp (``codegen.expert``).
"""
from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

from ..ir import ModelStructure, Plan
from . import safe
from .expert import on_expert_mesh
from .program import ContextParallel, DataParallel, FlattenMesh, FullyShard, Program, SplitPipeline, Step

DATA_AXIS = "dp_cp"  # the flattened dp x cp axis that data parallelism runs over under cp
ATTENTION, EMBEDDING = "attn", "embed"  # the zoo's modules that see positions: layers.N.attn, embed


def load_balance(plan: Plan) -> bool:
    """Chunks ``r`` and ``2cp - 1 - r`` when the sequence splits into ``2cp`` chunks (with sp, each rank's
    two chunks are split further over tp, which ``seq_len % (cp * tp) == 0`` already allows)."""
    return plan.seq_len % (2 * plan.mesh.cp) == 0


def data_axis(plan: Plan) -> str:
    """The mesh axis data parallelism runs over: dp, or the flattened dp x cp under context parallelism."""
    return DATA_AXIS if plan.mesh.cp > 1 else "dp"


def flatten_mesh(plan: Plan) -> list[Step]:
    return [FlattenMesh(axes=("dp", "cp"), name=DATA_AXIS)] if plan.mesh.cp > 1 else []


def context_parallel(plan: Plan, cfg: dict[str, Any]) -> list[Step]:
    """Each block's attention (the structure's ``attn``), then (zoo gpt) the embedding's learned positions.
    Another model's attention runs its SDPA over cp, and the model takes ``position_ids``
    (``runtime.context.ContextParallelSDPA``)."""
    cp, balance, s = plan.mesh.cp, load_balance(plan), cfg["structure"]
    steps: list[Step] = [ContextParallel(module=f"{s.block_path(i)}.{s.attn}", cp_size=cp, load_balance=balance)
                         for i in range(cfg["layers"])]
    if cfg["zoo"] and cfg["family"] == "gpt":
        steps.append(ContextParallel(module=EMBEDDING, cp_size=cp, load_balance=balance))
    return steps


def cp_blockers(s: ModelStructure) -> tuple[str, ...]:
    """Why the runtime cannot run context parallelism on a model of structure ``s`` (not the zoo's), in
    words; () when it can (what the module and its forward must also allow is ``api.cp_blockers``)."""
    why = []
    if not s.num_blocks or not s.attn:
        why.append("no attention module was found in repeated blocks")
    if s.pos_embed:
        why.append(f"the learned position embedding {s.pos_embed!r} is read by the model's forward from the local "
                   "token count, not from position_ids")
    return tuple(why)


def context_step(program: Program) -> ContextParallel | None:
    return next((s for s in program.steps if isinstance(s, ContextParallel)), None)


# ---- printing (codegen.emit.EMITTERS) ---------------------------------------------------------

def flatten_mesh_lines(step: FlattenMesh, target: str) -> tuple[str, list[str]]:
    axes = ", ".join(f'"{safe.name(a, "FlattenMesh.axes entry")}"' for a in step.axes)
    name = safe.name(step.name, "FlattenMesh.name")
    if on_expert_mesh(step.axes):  # after the expert mesh is built
        return "parallelize", [f'expert_mesh[{axes}]._flatten("{name}")  # then expert_mesh["{name}"] names them']
    return "mesh", [f'mesh[{axes}]._flatten("{name}")  # then mesh["{name}"] names those ranks']


def context_parallel_lines(step: ContextParallel, target: str) -> tuple[str, list[str]]:
    axis = safe.name(step.mesh_axis, "ContextParallel.mesh_axis")
    balance = safe.boolean(step.load_balance, "ContextParallel.load_balance")
    return "parallelize", [f'context_parallel({target}, mesh["{axis}"], load_balance={balance})']


def comment(step: Step) -> str | None:
    """The comment above a context-parallel step (lines joined by newlines), or None for other steps."""
    if isinstance(step, FlattenMesh) and on_expert_mesh(step.axes):
        return ("# an expert shard's replicas: its edp ranks times the cp ranks (each sees other tokens of the same "
                "sequences),\n# one axis its gradients are averaged over")
    if isinstance(step, FlattenMesh) and step.name != DATA_AXIS:
        return (f"# one axis over {' x '.join(step.axes)}: the full data-parallel rank, for slicing the batch "
                "and averaging the loss")
    if isinstance(step, FlattenMesh):
        return ("# every (dp, cp) rank sees other tokens, so data parallelism runs over dp x cp, flattened into one "
                "axis\n# (torchtitan's dp_shard_cp; DeviceMesh._flatten is how torchtitan builds it)")
    if isinstance(step, ContextParallel) and step.module.endswith(ATTENTION):
        layout = ("chunks cp_rank and 2 * cp - 1 - cp_rank of 2 * cp (equal causal work per rank)"
                  if step.load_balance else "chunk cp_rank of cp")
        return (f"# context parallelism over cp({safe.integer(step.cp_size, 'ContextParallel.cp_size')}): of every sequence each rank holds\n# {layout};\n"
                "# attention all-gathers K and V over cp (Llama 3, sec. 3.3.2) and masks by global position.\n"
                "# (torch's context_parallel dispatches only CUDA attention kernels: meshplan.runtime.context has "
                "this one)")
    if isinstance(step, ContextParallel):
        return "# the learned positions of this rank's tokens are their global positions"
    return _data_parallel_comment(step)


def _data_parallel_comment(step: Step) -> str | None:
    """Data parallelism over dp x cp says so (emit's own comments say "over dp")."""
    if isinstance(step, DataParallel) and step.mesh_axis == DATA_AXIS:
        return "# plain data parallelism over dp x cp: replicated parameters, gradients all-reduced"
    if not isinstance(step, FullyShard) or DATA_AXIS not in step.mesh_axes or step.module == "":
        return None
    if len(step.mesh_axes) == 2:
        return ("# plain data parallelism over dp x cp, as HSDP with a shard group of 1: replicated parameters, "
                "all-reduced gradients")
    if step.reshard_after_forward:
        return ("# ZeRO-3 (FSDP): shard parameters, gradients and optimizer state over dp x cp; gather each "
                "block's\n# parameters for its forward and again for its backward")
    return "# ZeRO-2: shard gradients and optimizer state over dp x cp; keep each block's gathered parameters"


def imports(program: Program) -> list[str]:
    if context_step(program) is None:
        return []
    return ["from meshplan.runtime.context import context_parallel, sequence_positions, sequence_share"]


# ---- the script parts that differ from codegen.script --------------------------------------------

CONSTANTS = """CP_SIZE = {cp_size}  # context-parallel ranks; each holds SEQ_LEN // CP_SIZE tokens of every sequence
LOAD_BALANCE = {load_balance}  # {layout}
"""

DATA = '''

# --data FILE: a flat token file (nanoGPT's train.bin, a Megatron .bin), memory-mapped; see meshplan/runtime/data.py
from meshplan.runtime.data import TokenFile, step_batch  # noqa: E402


def synthetic_batch(step: int, seed: int, dp_rank: int, cp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of step ``step``'s global batch of random tokens (the same stream on every rank):
    its dp rank's sequences, and of each its cp rank's tokens (the targets cut the same way)."""
    generator = torch.Generator().manual_seed(seed + step)
    tokens = torch.randint(MODEL_CONFIG["vocab"], (GLOBAL_BATCH, SEQ_LEN + 1), generator=generator)
    local = GLOBAL_BATCH // DP_SIZE
    tokens = tokens[dp_rank * local:(dp_rank + 1) * local]  # (local, s + 1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # predict the next token
    # this cp rank's tokens of each sequence, the targets cut the same way: (local, s // CP_SIZE) each
    return (sequence_share(inputs, CP_SIZE, cp_rank, load_balance=LOAD_BALANCE),
            sequence_share(targets, CP_SIZE, cp_rank, load_balance=LOAD_BALANCE))


def get_batch(step: int, seed: int, dp_rank: int, cp_rank: int, data: TokenFile | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of step ``step``'s global batch, from the token file ``data`` or synthetic."""
    if data is None:
        return synthetic_batch(step, seed, dp_rank, cp_rank)
    inputs, targets = step_batch(data, step, GLOBAL_BATCH, SEQ_LEN, dp_rank, DP_SIZE)
    return (sequence_share(inputs, CP_SIZE, cp_rank, load_balance=LOAD_BALANCE),
            sequence_share(targets, CP_SIZE, cp_rank, load_balance=LOAD_BALANCE))
'''

POSITIONS_LINE = "    cp_positions = sequence_positions(SEQ_LEN, CP_SIZE, cp_rank, LOAD_BALANCE, device)[None]\n"
# under pipelining the schedule calls each stage's model forward: the stage passes them on (runtime.pipeline.Stage)
STAGE_POSITIONS = ("    for module in stage_modules:  # each stage's model forward gets them as position_ids\n"
                   "        module.position_ids = cp_positions\n")

# (old, new) replacements in codegen.script.LOOP; each must be there (checked), so that a change to the
# plain loop shows up here as an error rather than as a silently different cp loop
LOOP_CHANGES = (
    ('    dp_rank, dp_group = mesh.get_local_rank("dp"), mesh["dp"].get_group()\n',
     '    dp_rank, cp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("cp")\n'
     f'    data_group = mesh["{DATA_AXIS}"].get_group()  # the dp x cp ranks: each sees other tokens\n'
     '    # the global positions of this rank\'s tokens (a model other than the zoo\'s takes them as position_ids)\n'
     + POSITIONS_LINE),
    ("get_batch(step, args.seed, dp_rank, data)", "get_batch(step, args.seed, dp_rank, cp_rank, data)"),
    ("dist.all_reduce(loss_sum, group=dp_group)  # the global mean loss: average over the dp ranks",
     "dist.all_reduce(loss_sum, group=data_group)  # the global mean loss: average over the dp x cp ranks"),
    ("loss = loss_sum.item() / DP_SIZE", "loss = loss_sum.item() / (DP_SIZE * CP_SIZE)"),
)


def script_parts(program: Program, parts: SimpleNamespace | ModuleType) -> SimpleNamespace:
    """``parts`` (``codegen.script``'s templates) with this rank's tokens taken and the loss averaged
    over dp x cp; ``parts`` unchanged without context parallelism."""
    step = context_step(program)
    if step is None:
        return parts
    out = SimpleNamespace(**{name: getattr(parts, name) for name in dir(parts) if name.isupper()})
    layout = ("chunks cp_rank and 2 * CP_SIZE - 1 - cp_rank of 2 * CP_SIZE: equal causal work per rank"
              if step.load_balance else "chunk cp_rank of CP_SIZE")
    out.CONSTANTS = parts.CONSTANTS + CONSTANTS.format(
        cp_size=safe.integer(step.cp_size, "ContextParallel.cp_size"),
        load_balance=safe.boolean(step.load_balance, "ContextParallel.load_balance"), layout=layout)
    out.DATA = DATA
    loop = parts.LOOP
    for old, new in LOOP_CHANGES:
        if old not in loop:
            raise AssertionError(f"codegen.context: the training loop no longer has {old.strip()!r}; "
                                 "update LOOP_CHANGES to the new loop")
        loop = loop.replace(old, new)
    from .model_source import kind  # (model_source reads context_step from here)

    if any(isinstance(s, SplitPipeline) for s in program.steps) and kind(program) != "zoo":
        loop = loop.replace(POSITIONS_LINE, POSITIONS_LINE + STAGE_POSITIONS)
    out.LOOP = loop
    return out
