"""Generated fused kernels against eager PyTorch on a CUDA GPU, at the shapes of a 7B and a 70B model.

    python bench/kernels.py                      # bf16, H100 SXM peak (3.35 TB/s)
    python bench/kernels.py --peak-bw 4.8e12 --dtype float32 --models 70b

Prints one row per kernel and pass (forward, backward): eager and fused milliseconds (median of
triton.testing.do_bench, L2 flushed between runs), the fused kernel's achieved bandwidth and its
share of the peak, and the speed-up. The bytes are those of the traffic model the kernels' comments
state (codegen.kernels.patterns): full-size tensors the fused pass reads and writes, times their
size. Shapes: tokens 8192 (4 sequences of 2048); 7B: h 4096, ffn 14336, 32 heads (Llama 3 8B);
70B: h 8192, ffn 28672, 64 heads (Llama 3 70B); the softmax runs on (4, heads, 2048, 2048) scores
with a (2048, 2048) causal mask. Without CUDA it says so and exits 1.

    python bench/kernels.py --interpret          # smoke run on CPU: tiny shapes, Triton interpreter

``--interpret`` runs every case at tiny shapes (64 tokens, h 64, ffn 160) under the Triton
interpreter on CPU, checks the fused outputs and gradients against eager (not for the dropouts,
whose masks differ), and prints the same table; its times are the interpreter's and mean nothing.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if "--interpret" in sys.argv[1:]:  # triton.jit reads it when a kernel is decorated, torch may import triton
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import torch.nn.functional as F

from meshplan.codegen.kernels import GPU_RULES, INTERPRETER_RULES, PATTERNS, BlockRules, generate_module, pattern
from meshplan.codegen.kernels.elementwise import backward_of, backward_traffic

MODELS = {"7b": dict(hidden=4096, ffn=14336, heads=32, batch=4, seq=2048),
          "70b": dict(hidden=8192, ffn=28672, heads=64, batch=4, seq=2048)}
TINY = dict(hidden=64, ffn=160, heads=4, batch=4, seq=16)  # --interpret
DROPOUTS = ("dropout_add", "bias_dropout_add")  # their masks differ from eager's: timed, not compared
ROW_BACKWARD_TRAFFIC = {"add_rmsnorm": 4, "add_layernorm": 4, "softmax": 3}  # as the templates' comments


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]  # of the full-size tensors
    inputs: Callable[[], list[torch.Tensor]]  # fresh tensors requiring grad
    eager: Callable[..., object]
    fused: Callable[..., object]


def load_fused(rules: BlockRules = GPU_RULES) -> object:
    """The generated module, written to a temporary folder and imported."""
    path = Path(tempfile.mkdtemp(prefix="meshplan_fused_")) / "fused_kernels.py"
    path.write_text(generate_module(PATTERNS, rules=rules))
    spec = importlib.util.spec_from_file_location("fused_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases(fused: object, dims: dict, dtype: torch.dtype, device: str) -> list[Case]:
    h, f, heads, batch, seq = dims["hidden"], dims["ffn"], dims["heads"], dims["batch"], dims["seq"]
    tokens = batch * seq

    def make(*shapes: tuple[int, ...]) -> Callable[[], list[torch.Tensor]]:
        return lambda: [torch.randn(s, dtype=dtype, device=device, requires_grad=True) for s in shapes]

    causal = torch.full((seq, seq), float("-inf"), dtype=dtype, device=device).triu(1)
    scale = 1.0 / (h // heads) ** 0.5
    return [
        Case("swiglu", (tokens, f), make((tokens, f), (tokens, f)), lambda a, b: F.silu(a) * b, fused.swiglu),
        Case("bias_gelu", (tokens, f), make((tokens, f), (f,)),
             lambda x, b: F.gelu(x + b, approximate="tanh"), fused.bias_gelu),
        Case("add_rmsnorm", (tokens, h), make((tokens, h), (tokens, h), (h,)),
             lambda x, r, w: (F.rms_norm(x + r, (h,), w, 1e-6), x + r), lambda x, r, w: fused.add_rmsnorm(x, r, w, 1e-6)),
        Case("add_layernorm", (tokens, h), make((tokens, h), (tokens, h), (h,), (h,)),
             lambda x, r, w, b: (F.layer_norm(x + r, (h,), w, b, 1e-5), x + r),
             lambda x, r, w, b: fused.add_layernorm(x, r, w, b, 1e-5)),
        Case("softmax", (batch, heads, seq, seq), make((batch, heads, seq, seq)),
             lambda x: torch.softmax(x * scale + causal, dim=-1), lambda x: fused.softmax(x, causal, scale)),
        Case("dropout_add", (tokens, h), make((tokens, h), (tokens, h)),
             lambda x, r: F.dropout(x, 0.1, training=True) + r, lambda x, r: fused.dropout_add(x, r, 0.1)),
        Case("bias_dropout_add", (tokens, h), make((tokens, h), (h,), (tokens, h)),
             lambda x, b, r: F.dropout(x + b, 0.1, training=True) + r, lambda x, b, r: fused.bias_dropout_add(x, b, r, 0.1)),
    ]


def fused_bytes(name: str, numel: int, elem_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes the fused kernels move, by the traffic model."""
    p = pattern(name)
    fwd = p.forward_traffic().fused
    bwd = ROW_BACKWARD_TRAFFIC.get(name) or backward_traffic(p, backward_of(p)).fused
    return fwd * numel * elem_bytes, bwd * numel * elem_bytes


def _outputs(value: object) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def passes(fn: Callable[..., object], inputs: list[torch.Tensor]) -> tuple[Callable[[], object], Callable[[], object]]:
    """(forward, backward) closures: the backward replays one recorded graph with fixed output gradients."""
    outs = _outputs(fn(*inputs))
    grads = [torch.randn_like(o) for o in outs]

    def forward() -> object:
        with torch.no_grad():  # nothing saved for a backward
            return fn(*inputs)

    def backward() -> object:
        return torch.autograd.grad(outs, inputs, grads, retain_graph=True)

    return forward, backward


def time_ms(fn: Callable[[], object]) -> float:
    if not torch.cuda.is_available():  # --interpret: wall time of one call after a warm-up
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def check(case: Case, tol: float = 1e-5) -> None:
    """Fused outputs and input gradients against eager, fp32, on the same inputs and output gradients."""
    inputs = case.inputs()
    results = []
    for fn in (case.eager, case.fused):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        outs = _outputs(fn(*leaves))
        gen = torch.Generator().manual_seed(0)
        torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs])
        results.append([o.detach() for o in outs] + [t.grad for t in leaves])
    for i, (want, got) in enumerate(zip(*results)):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m: f"{case.name}, tensor {i}: {m}")


def row(label: str, shape: tuple[int, ...], eager_ms: float, fused_ms: float, moved: float, peak: float) -> str:
    gbs = moved / (fused_ms * 1e-3) / 1e9
    return (f"{label:<24} {'x'.join(map(str, shape)):>20} {eager_ms:>9.3f} {fused_ms:>9.3f} {gbs:>9.0f} "
            f"{100 * gbs * 1e9 / peak:>6.1f}% {eager_ms / fused_ms:>7.2f}x")


def bench(fused: object, model: str, dtype: torch.dtype, peak: float, device: str = "cuda") -> list[str]:
    lines = []
    for case in cases(fused, MODELS.get(model, TINY), dtype, device):
        if device == "cpu" and case.name not in DROPOUTS:
            check(case)
        numel = 1
        for d in case.shape:
            numel *= d
        fwd_bytes, bwd_bytes = fused_bytes(case.name, numel, torch.finfo(dtype).bits // 8)
        eager_fwd, eager_bwd = passes(case.eager, case.inputs())
        fused_fwd, fused_bwd = passes(case.fused, case.inputs())
        for what, eager, mine, moved in (("fwd", eager_fwd, fused_fwd, fwd_bytes), ("bwd", eager_bwd, fused_bwd, bwd_bytes)):
            lines.append(row(f"{model} {case.name} {what}", case.shape, time_ms(eager), time_ms(mine), moved, peak))
        del eager_fwd, eager_bwd, fused_fwd, fused_bwd  # free this case's graphs before the next one's
        if device == "cuda":
            torch.cuda.empty_cache()
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak-bw", type=float, default=3.35e12, help="peak memory bandwidth, B/s (H100 SXM: 3.35e12)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--interpret", action="store_true",
                        help="smoke run on CPU: tiny shapes in the Triton interpreter, checked against eager")
    args = parser.parse_args(argv)
    if args.interpret:
        return smoke(args.peak_bw)
    if not torch.cuda.is_available():
        print("bench/kernels.py: no CUDA GPU here; these timings need one. For a smoke run of every kernel on "
              "CPU (tiny shapes, Triton interpreter, no meaningful times): python bench/kernels.py --interpret",
              file=sys.stderr)
        return 1
    fused = load_fused()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, peak {args.peak_bw / 1e12:.2f} TB/s; "
          "fused GB/s counts the traffic model's bytes")
    print(f"{'kernel':<24} {'shape':>20} {'eager ms':>9} {'fused ms':>9} {'GB/s':>9} {'peak':>7} {'speedup':>8}")
    for model in args.models:
        for line in bench(fused, model, getattr(torch, args.dtype), args.peak_bw):
            print(line, flush=True)
    return 0


def smoke(peak: float) -> int:
    """Every kernel at tiny shapes in the Triton interpreter, checked against eager fp32."""
    torch.manual_seed(0)
    fused = load_fused(INTERPRETER_RULES)
    print("Triton interpreter on CPU, float32, tiny shapes: outputs and gradients checked against eager "
          "(dropouts only run); the times are the interpreter's and mean nothing")
    print(f"{'kernel':<24} {'shape':>20} {'eager ms':>9} {'fused ms':>9} {'GB/s':>9} {'peak':>7} {'speedup':>8}")
    for line in bench(fused, "tiny", torch.float32, peak, device="cpu"):
        print(line, flush=True)
    print("all fused kernels match eager")
    return 0


if __name__ == "__main__":
    sys.exit(main())
