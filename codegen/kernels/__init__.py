"""Generated Triton kernels for fused chains: elementwise ones from sympy expressions and their
sympy derivatives, row-wise ones (norms, softmax) from templates; each with its backward.

    source = generate_module(["swiglu", "add_rmsnorm"])    # or fusions from codegen.fusion.find_fusions
    Path("fused.py").write_text(source)                    # the caller writes it; codegen stays pure
    from fused import swiglu, add_rmsnorm                  # torch.autograd-aware functions
"""
from .expr import VOCABULARY, gradients, parse, sigmoid, symbol, to_triton
from .generate import GPU_RULES, INTERPRETER_RULES, BlockRules, generate_module, pattern_source
from .patterns import BY_NAME, PATTERNS, Broadcast, Kind, Pattern, Step, Traffic, pattern

__all__ = ["BY_NAME", "GPU_RULES", "INTERPRETER_RULES", "PATTERNS", "VOCABULARY", "BlockRules", "Broadcast", "Kind",
           "Pattern", "Step", "Traffic", "generate_module", "gradients", "parse", "pattern", "pattern_source", "sigmoid",
           "symbol", "to_triton"]
