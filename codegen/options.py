"""The run options of an emitted script, the flags ``meshplan run`` has (``runtime.train.Options``):

    --clip-grad NORM  clip_grad_norm_(model, NORM[, pp_group]) before optimizer.step()  (runtime/clip.py)
    --compile         compile_blocks(model, BLOCKS) after the build (model_source.COMPILE)  (runtime/clip.py)
    --init-from DIR   load_pretrained_into(model, DIR) after materialization             (runtime/pretrained.py)

The script calls the runtime's own functions, so that it and ``meshplan run`` clip, compile and load
with the same code: the global norm over every mesh axis (DTensor shards, expert and pipeline groups),
each block compiled in place before sharding (names unchanged), each rank reading only its slices of
the checkpoint. A flag the plan's model cannot take is still accepted, then refused in one line before
any process group starts (exit status 2, as ``meshplan run``): --init-from for a model transformers
does not build (the checkpoint is matched by the model's own parameter names, which are a Hugging Face
checkpoint's only for a transformers model), --compile for a model without a block container or a program
torch cannot compile (``compile_refusal``).
"""
from __future__ import annotations

from ..ir import Schedule
from . import model_source, safe
from .program import Policy, Program, Recompute, SplitPipeline, TensorParallel

INDENT = "    "

ARGS = [
    'parser.add_argument("--clip-grad", type=float, metavar="NORM",',
    '                    help="clip gradients to this global 2-norm (over every mesh axis) before each step")',
    'parser.add_argument("--compile", action="store_true", help="torch.compile each block before sharding")',
    'parser.add_argument("--init-from", metavar="DIR", help="start from this Hugging Face safetensors checkpoint "',
    '                    "(model.save_pretrained\'s directory); each rank reads only what it holds")',
]

# after materialization: the sharded model's own state dict is the load plan
INIT_FROM = ["if args.init_from is not None:  # each rank reads only the slices it holds",
             f"{INDENT}load_pretrained_into(model, args.init_from)"]


def compile_refusal(program: Program) -> str | None:
    """Why --compile cannot run ``program`` on this torch (2.13), or None. Two programs fail with each block's
    forward compiled (full recomputation, none, 1F1B and interleaved schedules compile, and train as one process):

    - under tensor parallelism, selective recomputation: AOT autograd's forward stops ("expected all
      tensors_saved_with_vc_check to be Tensors": the selective policy saves a DTensor collective's output, and
      a DeviceMesh with it), compiled before or after the checkpoint wrapper alike;
    - the zero-bubble schedule, whose backward takes the input gradients first and the weight gradients later
      from the same graph, where a compiled block is one backward node: with AOT autograd's donated buffers
      it refuses the kept graph, and without them dp2 x pp2 trained other weights than one process
      (pytorch/pytorch#161904)."""
    tp = any(isinstance(step, TensorParallel) for step in program.steps)
    selective = any(isinstance(step, Recompute) and step.policy == Policy.SELECTIVE for step in program.steps)
    if tp and selective:
        return ("--compile with selective recomputation under tensor parallelism fails in torch 2.13's AOT autograd "
                "(the selective policy saves a DTensor collective's output); plan with --recompute full or none, "
                "or run without --compile")
    if any(isinstance(step, SplitPipeline) and step.schedule == Schedule.ZERO_BUBBLE for step in program.steps):
        return ("--compile with the zero-bubble pipeline schedule is refused: its backward splits input and weight "
                "gradients, which a compiled block's single backward does not (pytorch/pytorch#161904); plan with "
                "--schedule 1f1b or interleaved-1f1b, or run without --compile")
    return None


def takes_init_from(program: Program) -> bool:
    return model_source.kind(program) == "hf"


def imports(program: Program) -> list[str]:
    lines = ["from meshplan.ir import PlanError",
             "from meshplan.runtime.clip import check_max_norm, clip_grad_norm_, compile_blocks"]
    if takes_init_from(program):
        lines.append("from meshplan.runtime.pretrained import find_safetensors, load_pretrained_into")
    return lines


def constants(blocks: str) -> list[str]:
    return ["", f"BLOCKS = {safe.string_literal(safe.module_path(blocks, 'the model structure blocks'))}"
                "  # --compile compiles each block in this container"]


def check_lines(program: Program, blocks: str) -> list[str]:
    """Lines in ``main`` after ``parse_args``: bad or refused flags end the script in one line."""
    lines = ["try:  # a bad flag fails here, in one line, before any process group starts",
             f"{INDENT}if args.clip_grad is not None:",
             f"{INDENT * 2}check_max_norm(args.clip_grad)"]
    if takes_init_from(program):
        lines += [f"{INDENT}if args.init_from is not None:", f"{INDENT * 2}find_safetensors(args.init_from)"]
    lines += ["except PlanError as exc:", f'{INDENT}parser.exit(2, f"error: {{exc}}\\n")']
    if not takes_init_from(program):
        lines += _refusal("args.init_from is not None", (
            f"--init-from loads a Hugging Face checkpoint by the parameter names of a transformers model, but "
            f"this plan's model is built {_built_by(program)}; plan a transformers model to start from its "
            "checkpoint"))
    if not blocks:
        lines += _refusal("args.compile", (
            "--compile compiles each block of the model's block container, but this plan's model has none; "
            "omit --compile for this model"))
    elif (refusal := compile_refusal(program)) is not None:
        lines += _refusal("args.compile", refusal)
    return lines


def _built_by(program: Program) -> str:
    return "by the meshplan zoo" if model_source.kind(program) == "zoo" else "by a builder function"


def _refusal(condition: str, message: str, width: int = 80) -> list[str]:
    """``if condition: parser.exit(2, "error: message")``, the message split over string literals of
    about ``width`` characters (Python joins adjacent literals)."""
    pieces, piece = [], ""
    for word in f"error: {message}".split(" "):
        if piece and len(piece) + len(word) > width:
            pieces.append(piece)
            piece = ""
        piece += word + " "
    pieces.append(piece.rstrip() + "\n")
    lines = [f"if {condition}:"]
    for k, piece in enumerate(pieces):
        start = f"{INDENT}parser.exit(2, " if k == 0 else INDENT + " " * len("parser.exit(2, ")
        lines.append(start + safe.string_literal(piece) + (")" if k == len(pieces) - 1 else ""))
    return lines
