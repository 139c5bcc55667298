"""Generated fused kernels against eager PyTorch, forward and backward, under the Triton interpreter.

The generated module is written to a temporary folder and imported with ``TRITON_INTERPRET=1`` set
(and triton.language's helpers wrapped to match, see ``interpret``), so its kernels run on CPU tensors. Shapes are the irregular ones of the Triton tutorials
(1823 x 781) and a short wide one (7 x 1000). Outputs and input gradients must match eager fp32
within 1e-5; a gradient summed over rows (a bias, a norm weight) is compared with eager in fp64,
normwise within 1e-5, because fp32 eager itself differs from fp64 there by more than 1e-5 an
element (the order of a 1823-term sum).
"""
from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import sys
import uuid

import numpy as np
import pytest
import sympy
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from meshplan.codegen.kernels import (INTERPRETER_RULES, PATTERNS, Kind, Pattern, Step, generate_module, gradients,
                                      pattern, symbol, to_triton)
from meshplan.codegen.kernels.elementwise import backward_of

SHAPES = [(1823, 781), (7, 1000)]
# tl.sigmoid's exp(-x) overflows to inf for x < -88 in the interpreter's numpy, and the sigmoid is then 0, as it should be
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
TOL = dict(atol=1e-5, rtol=1e-5)
_count = itertools.count()


def load(source: str, folder):
    """Import generated source as a fresh module, kernels interpreted."""
    path = folder / f"fused_{uuid.uuid4().hex[:8]}_{next(_count)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _interpret_language() -> list[tuple[object, str, object]]:
    """Wrap triton.language's own @jit helpers (tl.sum, tl.max, tl.sigmoid, tl.rand, ...) for the
    interpreter, as ``triton.jit`` does when TRITON_INTERPRET is set at import; (module, name, original)
    to put back."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    wrapped: dict[int, object] = {}
    undo = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if type(value) is JITFunction:
                undo.append((module, attr, value))
                setattr(module, attr, wrapped.setdefault(id(value), InterpretedFunction(value.fn)))
    return undo


@pytest.fixture(scope="module", autouse=True)
def interpret():
    """The kernels of this module run in the Triton interpreter.

    ``triton.jit`` reads TRITON_INTERPRET when a function is decorated: the generated module's kernels
    are decorated when it loads, after the variable is set here, but triton.language's helpers were
    decorated when triton was first imported, which other tests do earlier (through torch._dynamo).
    Those are wrapped for the interpreter while this module runs, and all is put back afterwards.
    """
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    undo = _interpret_language()
    yield
    for module, attr, value in undo:
        setattr(module, attr, value)
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old


@pytest.fixture(scope="module")
def fused(interpret, tmp_path_factory):
    return load(generate_module(PATTERNS, rules=INTERPRETER_RULES), tmp_path_factory.mktemp("fused"))


def _run(fn, inputs, scalars, grads_out):
    """fn's outputs and the gradients of its tensor inputs for output gradients ``grads_out``."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*leaves, *scalars)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(outs, grads_out(outs))
    return [o.detach() for o in outs], [t.grad for t in leaves]


def _check(name, fused_fn, eager_fn, inputs, scalars=(), vectors=()):
    """Compare fused and eager: outputs and full-size gradients in fp32, summed gradients in fp64."""
    gen = torch.Generator().manual_seed(1)
    cache = {}

    def grads_out(outs):  # the same random output gradients for every run
        return cache.setdefault(len(outs), [torch.randn(o.shape, generator=gen) for o in outs])

    outs, grads = _run(fused_fn, inputs, scalars, grads_out)
    ref_outs, ref_grads = _run(eager_fn, inputs, scalars, grads_out)
    _, grads64 = _run(eager_fn, [t.double() for t in inputs], scalars,
                      lambda outs: [g.double() for g in grads_out(outs)])
    for got, want in zip(outs, ref_outs):
        torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{name} forward: {m}")
    for i, (got, want, want64) in enumerate(zip(grads, ref_grads, grads64)):
        if i in vectors:
            err = (got.double() - want64).abs().max() / want64.abs().max()
            assert err < 1e-5, f"{name}: gradient {i} (summed over rows) is off by {err:.2e} of its norm"
        else:
            torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{name} gradient {i}: {m}")


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(hash(shape) % 2**31))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_swiglu_and_bias_gelu_match_eager(fused, shape):
    m, n = shape
    _check("swiglu", fused.swiglu, lambda a, b: F.silu(a) * b, [_randn(m, n), 2 * _randn(m, n)])
    _check("bias_gelu", fused.bias_gelu, lambda x, bias: F.gelu(x + bias, approximate="tanh"),
           [2 * _randn(m, n), _randn(n)], vectors={1})


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_add_norms_match_eager(fused, shape):
    m, n = shape
    x, r, w, b = _randn(m, n), _randn(m, n), 1 + 0.1 * _randn(n), 0.1 * _randn(n)
    _check("add_rmsnorm", fused.add_rmsnorm, lambda x, r, w, eps: (F.rms_norm(x + r, (n,), w, eps), x + r),
           [x, r, w], (1e-6,), vectors={2})
    _check("add_layernorm", fused.add_layernorm,
           lambda x, r, w, b, eps: (F.layer_norm(x + r, (n,), w, b, eps), x + r), [x, r, w, b], (1e-5,), vectors={2, 3})


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_scale_mask_softmax_matches_eager(fused, shape):
    m, n = shape
    mask = torch.zeros(m, n).masked_fill(_randn(m, n) > 1.0, float("-inf"))
    _check("softmax", lambda x, scale: fused.softmax(x, mask, scale),
           lambda x, scale: torch.softmax(scale * x + mask, dim=-1), [3 * _randn(m, n)], (0.125,))


def test_softmax_broadcasts_a_trailing_mask(fused):
    """An (s, s) causal mask over (b, heads, s, s) scores, read row modulo s, never expanded."""
    s = 37
    causal = torch.full((s, s), float("-inf")).triu(1)
    x = _randn(2, 3, s, s)
    _check("softmax", lambda x: fused.softmax(x, causal, 0.5), lambda x: torch.softmax(0.5 * x + causal, -1), [x])
    with pytest.raises(ValueError, match="trailing dims"):
        fused.softmax(x, causal[:, :5])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dropouts_match_eager_with_the_same_mask(fused, shape):
    m, n = shape
    p, seed = 0.25, 1234
    keep = fused.keep_mask((m, n), p, seed)
    _check("dropout_add", lambda x, r: fused.dropout_add(x, r, p, seed), lambda x, r: x * keep / (1 - p) + r,
           [_randn(m, n), _randn(m, n)])
    _check("bias_dropout_add", lambda x, b, r: fused.bias_dropout_add(x, b, r, p, seed),
           lambda x, b, r: (x + b) * keep / (1 - p) + r, [_randn(m, n), _randn(n), _randn(m, n)], vectors={1})


def test_keep_mask_drops_a_fraction_p_and_follows_the_seed(fused):
    a, b = fused.keep_mask((1823, 781), 0.25, 7), fused.keep_mask((1823, 781), 0.25, 8)
    assert abs(1 - a.mean().item() - 0.25) < 0.005
    assert torch.equal(a, fused.keep_mask((1823, 781), 0.25, 7)) and not torch.equal(a, b)
    torch.manual_seed(0)
    out = fused.dropout_add(torch.ones(100, 10), torch.zeros(100, 10), 0.5)
    assert set(out.unique().tolist()) <= {0.0, 2.0}


def test_launchers_explain_bad_shapes(fused):
    with pytest.raises(ValueError, match=r"b has shape \(4, 6\) but a has \(4, 5\)"):
        fused.swiglu(torch.zeros(4, 5), torch.zeros(4, 6))
    with pytest.raises(ValueError, match=r"expected \(5,\)"):
        fused.bias_gelu(torch.zeros(4, 5), torch.zeros(4))


def test_module_has_one_forward_and_backward_kernel_per_pattern_with_traffic_comments():
    source = generate_module(PATTERNS)
    tree = ast.parse(source)
    kernels = {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.endswith("_kernel")}
    for p in PATTERNS:
        assert {f"_{p.name}_fwd_kernel", f"_{p.name}_bwd_kernel"} <= kernels
    assert source.count("# memory traffic (forward)") == len(PATTERNS)
    assert source.count("# memory traffic (backward)") == len(PATTERNS)
    assert "ELEMENTWISE_BLOCK = 1024" in source and source.count("import torch\n") == 1


def test_generate_module_takes_names_patterns_and_fusions_once_each():
    class Fused:  # what codegen.fusion.Fusion offers generate_module
        pattern = "swiglu"
    source = generate_module(["swiglu", pattern("swiglu"), Fused(), "add_rmsnorm"])
    assert source.count("def swiglu(") == 1 and "def add_rmsnorm(" in source and "def bias_gelu(" not in source
    with pytest.raises(KeyError, match="no fusion pattern named 'nope'"):
        generate_module(["nope"])


def test_printer_refuses_what_triton_cannot_spell():
    a = symbol("a")
    assert to_triton(a**-2) == "(1.0 / (a * a))"
    with pytest.raises(ValueError, match="no Triton spelling for sin"):
        to_triton(sympy.sin(a))


def _numeric(expr, names):
    """sympy -> numpy function of ``names`` in fp64."""
    return sympy.lambdify([symbol(n) for n in names], expr,
                          modules=[{"sigmoid": lambda v: 1 / (1 + np.exp(-v))}, "numpy"])


def _check_backward_against_sympy(module, p: Pattern, values: dict, scalars: dict, keep=None):
    """The generated ``<name>_bwd`` against sympy's derivative of ``p.expr``, evaluated in fp64."""
    dout = values.pop("dout")
    env = {**values, **scalars, **({"keep": keep} if keep is not None else {})}
    names = list(env)
    loads = [torch.from_numpy(values[a]).float() for a in backward_of(p).loads]  # what the backward reads
    bwd = getattr(module, f"{p.name}_bwd")
    extra = [scalars[s] for s, _ in p.scalars] + ([scalars["seed"]] if p.randoms else [])
    got = bwd(torch.from_numpy(dout).float(), *loads, *extra)
    for arg, g, d in zip(p.args, got, gradients(p.expression, p.args)):
        want = np.broadcast_to(_numeric(d, ["dout", *names])(dout, *env.values()), dout.shape)
        if p.broadcast_of(arg) == "vector":
            want = want.reshape(-1, dout.shape[-1]).sum(0)
        np.testing.assert_allclose(g.double().numpy(), want, rtol=1e-4, atol=1e-4 * (1 + np.abs(want).max()))


ELEMENTWISE = [p for p in PATTERNS if p.kind is Kind.ELEMENTWISE]


@settings(max_examples=20, deadline=None)
@given(p=st.sampled_from(ELEMENTWISE), seed=st.integers(0, 2**20), rows=st.integers(1, 9), cols=st.integers(1, 40),
       prob=st.floats(0.0, 0.9))
def test_pattern_backwards_match_sympy_derivatives(fused, p, seed, rows, cols, prob):
    rng = np.random.default_rng(seed)
    values = {a: rng.uniform(-3, 3, size=(cols,) if p.broadcast_of(a) == "vector" else (rows, cols))
              for a in p.args}
    values["dout"] = rng.uniform(-1, 1, size=(rows, cols))
    scalars = {"p": prob, "seed": seed} if p.randoms else {}
    keep = fused.keep_mask((rows, cols), prob, seed).double().numpy() if p.randoms else None
    _check_backward_against_sympy(fused, p, values, scalars, keep)


_UNARY = ["sigmoid({})", "tanh({})", "silu({})", "gelu_tanh({})", "({})**2", "exp(-({})**2)", "1 / (1 + ({})**2)"]


def _of(leaf: str):
    """Random expressions of one symbol: unary functions of the vocabulary and products with constants."""
    return st.recursive(st.sampled_from([leaf, f"(0.5 * {leaf})", f"({leaf} - 2)"]), lambda inner: st.one_of(
        st.tuples(st.sampled_from(_UNARY), inner).map(lambda t: t[0].format(t[1])),
        st.tuples(inner, st.sampled_from(["+", "*"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})")), max_leaves=4)


_EXPRS = st.builds(lambda x, op, y, outer: outer.format(f"{x} {op} {y}"),
                   _of("a"), st.sampled_from(["+", "-", "*"]), _of("b"), st.sampled_from(["{}", *_UNARY]))


@settings(max_examples=25, deadline=None)
@given(text=_EXPRS,
       seed=st.integers(0, 2**20))
def test_random_expression_backward_matches_sympy(tmp_path_factory, text, seed):
    """Any expression of the vocabulary: the generated backward is sympy's derivative, numerically."""
    p = Pattern(name="random_chain", kind=Kind.ELEMENTWISE, steps=(Step(ops=("random",), args=("a", "b")),),
                expr=text, formula=text, source="hypothesis")
    module = load(generate_module([p], rules=INTERPRETER_RULES), tmp_path_factory.mktemp("random"))
    rng = np.random.default_rng(seed)
    values = {"a": rng.uniform(-2, 2, (3, 17)), "b": rng.uniform(-2, 2, (3, 17)), "dout": rng.uniform(-1, 1, (3, 17))}
    _check_backward_against_sympy(module, p, values, {})
