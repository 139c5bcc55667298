"""Plan values never become code in emitted programs (issue 15).

A plan file is data; the script emitted from it runs under torchrun. Every string a plan carries
(model name and keys, cluster, dtype, fusions, layouts, source, solver notes) is put into a plan
that goes through a JSON file and ``Plan.emit``, with payloads that try to end a string, a
docstring or a line. Each script must compile, keep the value as data (``MODEL_CONFIG`` equals the
plan's model), and run its module code (and one script its training step) without the payload's
marker file appearing. Names printed as code (mesh axes, module paths, ops, kernels) are refused.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import api, ir, zoo
from meshplan.cli import main
from meshplan.codegen import BuildMesh, FuseKernel, Recompute, TensorParallel, emit_source, lower, safe, script
from meshplan.codegen import fused as fused_module
from meshplan.codegen.program import FullyShard, Policy

MARKER = "PWNED"
PAYLOADS = (
    f'"; __import__("os").system("touch {MARKER}") #',
    f'"""\nimport os; os.system("touch {MARKER}")\n"""',
    "\\\n",
    f"'''\nimport os; os.system('touch {MARKER}')\n'''",
    f'\\"""; __import__("os").system("touch {MARKER}"); """',
    f'x"""\r__import__("os").system("touch {MARKER}")#',
    f"\u2028__import__('os').system('touch {MARKER}')\x00",
    f'é"}}; __import__("os").system("touch {MARKER}"); {{"',
    '"',
    "\\",
)


def _plan(**kw) -> api.Plan:
    base = dict(model=zoo.config("gpt-tiny").to_dict(), cluster="cpu:1x1", global_batch=2, seq_len=16,
                mesh=ir.Mesh(), micro_batch_size=2, recompute=("selective", "full", "none", "none"))
    return api.Plan(**{**base, **kw})


def _via_file(plan: api.Plan, tmp_path: Path, tag: str) -> api.Plan:
    """The plan as an attacker hands it over: a JSON file, loaded."""
    return api.load(plan.save(tmp_path / f"{tag}.json"))


def _cases(payload: str) -> dict[str, dict]:
    """Plan fields (as ``_plan`` keyword arguments) that carry ``payload``, one case each."""
    cfg = zoo.config("gpt-tiny").to_dict()
    solver = ir.SolverInfo(status=payload, wall_s=0.0, gap=0.0, binding=payload, intra_op=payload,
                           alternatives=({"summary": payload, "why": payload},))
    return {
        "model_name": dict(model={**cfg, "name": payload}),
        "model_key": dict(model={**cfg, payload: 1}),
        "model_value": dict(model={**cfg, "note": [payload, {payload: payload}], "scale": 1.5, "on": None}),
        "cluster": dict(cluster=payload),
        "dtype": dict(dtype=payload),
        "fusions": dict(fusions=(payload, "swiglu")),
        "param_layouts": dict(param_layouts={payload: ("R",) * len(ir.AXES)}),
        "source_structure": dict(source={"kind": payload}, structure={payload: payload}),
        "solver": dict(solver=solver),
    }


def _exec_all(scripts: list[tuple[Path, dict]], cwd: Path) -> str:
    """Run the module code of each script (everything but ``main()``) in one fresh process, in ``cwd``;
    each checks that its MODEL_CONFIG is the plan's model. Returns the runner's output."""
    expected = cwd / "expected.json"
    expected.write_text(json.dumps([[str(p), model] for p, model in scripts]))
    runner = ("import json, runpy, sys\n"
              "for path, model in json.load(open(sys.argv[1])):\n"
              "    g = runpy.run_path(path, run_name='emitted')\n"
              "    assert g['MODEL_CONFIG'] == model, (path, g['MODEL_CONFIG'], model)\n"
              "    print('ok', path, ascii(g['__doc__'].splitlines()[0]))\n")
    done = subprocess.run([sys.executable, "-c", runner, str(expected)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _emit_or_refuse(kw: dict, path: Path, tmp_path: Path) -> api.Plan | None:
    """The plan with ``kw``, saved, loaded and emitted to ``path``; None where meshplan refuses it with
    a PlanError (the plan, the loader or emit may: all of them are fine, with a message)."""
    try:
        plan = _via_file(_plan(**kw), tmp_path, path.stem)
        plan.emit(path, fuse="fusions" in kw)
    except ir.PlanError as exc:
        assert str(exc) and not path.exists()
        return None
    return plan


def test_every_plan_string_stays_data_in_the_emitted_script(tmp_path) -> None:
    scripts, docs = [], {}
    for i, payload in enumerate(PAYLOADS):
        for field, kw in _cases(payload).items():
            path = tmp_path / f"{field}-{i}.py"
            plan = _emit_or_refuse(kw, path, tmp_path)
            if plan is not None:
                scripts.append((path, plan.model))
                docs[path.stem] = path.read_text(encoding="utf-8")
        # the same strings where only the Program carries them (past any check the plan loader makes):
        # the model config, the summary and header lines of the docstring, and the caller's name
        model = {**zoo.config("gpt-tiny").to_dict(), "name": payload, payload: [payload, {payload: 1.5}]}
        program = dataclasses.replace(lower(_plan()), plan_summary=payload, header=(payload, f"cluster: {payload}"),
                                      model_config=tuple(model.items()))
        path = tmp_path / f"program-{i}.py"
        path.write_text(emit_source(program, name=payload), encoding="utf-8")
        docs[path.stem] = path.read_text(encoding="utf-8")
        scripts.append((path, model))
    for stem, source in docs.items():
        compile(source, stem, "exec")
        assert source.isascii(), stem  # every non-ASCII character of the plan printed as an escape
    # the docstring shows a quoted, escaped copy of each plan string the header names
    for stem in [s for s in docs if s.split("-")[0] in ("model_name", "cluster", "dtype", "fusions")]:
        payload = PAYLOADS[int(stem.rsplit("-", 1)[1])]
        assert safe.shown(payload) in ast.get_docstring(ast.parse(docs[stem]), clean=False), stem
    out = _exec_all(scripts, tmp_path)
    assert sum(line.startswith("ok ") for line in out.splitlines()) == len(scripts)
    assert not (tmp_path / MARKER).exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_script_full_of_payloads_trains_a_step_and_creates_no_marker(tmp_path) -> None:
    """One process (the env a torchrun rank gets), one step, payloads in every string the script shows:
    the model's name, the docstring's summary and header lines (cluster, dtype, fusions), the title."""
    cfg = {**zoo.config("gpt-tiny").to_dict(), "name": PAYLOADS[1]}
    program = dataclasses.replace(lower(_plan()), model_config=tuple(cfg.items()), plan_summary=PAYLOADS[0],
                                  header=tuple(f"{what}: {p}" for what, p in zip(("cluster", "dtype", "fusion"),
                                                                                   PAYLOADS[3:])))
    path = tmp_path / "train-all.py"
    path.write_text(emit_source(program, name=PAYLOADS[2]), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    done = subprocess.run([sys.executable, str(path), "--steps", "1"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "step 1 loss" in done.stdout
    assert not (tmp_path / MARKER).exists()


# ---- names printed as code: refused, naming the field ------------------------------------------

BAD_NAME = 'tp"]); __import__("os").system("touch PWNED"); x = mesh["tp'


def _program(**kw):
    return dataclasses.replace(lower(_plan()), **kw)


@pytest.mark.parametrize("step, field", [
    (BuildMesh(dims=((BAD_NAME, 1),)), "BuildMesh axis"),
    (TensorParallel(module="", plan=(), mesh_axis=BAD_NAME), "TensorParallel.mesh_axis"),
    (FullyShard(module='layers.0"); import os; ("', mesh_axes=("dp",), reshard_after_forward=True), "module path"),
    (FullyShard(module="layers.0", mesh_axes=(BAD_NAME,), reshard_after_forward=True), "FullyShard.mesh_axes"),
    (FullyShard(module="layers.0", mesh_axes=("dp",), reshard_after_forward="True or os.system('x')"),
     "reshard_after_forward"),
    (Recompute(module="layers.0.attn", policy=Policy.SELECTIVE, save_ops=("aten.mm.default, os.system('x')",)),
     "save_ops"),
    (FuseKernel(module="layers.0.mlp", kernel="swiglu(x); import os"), "FuseKernel.kernel"),
    (FuseKernel(module="layers.0.mlp", kernel="swiglu", submodules=("w1", 'w3"); import os; ("', "w2")),
     "FuseKernel.submodules entry"),
    (FuseKernel(module="layers.0.mlp", kernel="swiglu", submodules=("w1", "w3")), "FuseKernel.submodules"),
], ids=["mesh-axis", "tp-axis", "module-path", "fsdp-axis", "bool", "save-op", "kernel", "kernel-child",
        "kernel-children"])
def test_a_name_that_is_not_a_name_is_refused(step, field) -> None:
    base = lower(_plan())
    steps = (step, *base.steps[1:]) if isinstance(step, BuildMesh) else (*base.steps, step)
    with pytest.raises(ir.InvalidPlanError, match=field):
        emit_source(dataclasses.replace(base, steps=steps))


def test_numbers_printed_as_code_must_be_integers() -> None:
    with pytest.raises(ir.InvalidPlanError, match="Program.global_batch"):
        emit_source(_program(global_batch="__import__('os')", micro_batch_size="__import__('os')",
                             num_microbatches=1, dp_size=1))


def test_a_model_config_value_that_is_not_json_is_refused() -> None:
    with pytest.raises(ir.InvalidPlanError, match=r"plan.model\['x'\].*JSON values"):
        emit_source(_plan(model={**zoo.config("gpt-tiny").to_dict(), "x": b"bytes"}))


# ---- the literal and docstring escapes, for any text ---------------------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                     max_leaves=8)


def _same(a, b) -> bool:
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_literal_is_ascii_and_evaluates_to_the_value(value) -> None:
    code = safe.literal(value, "v")
    assert code.isascii() and "\n" not in code
    tree = ast.parse(code, mode="eval")  # one expression: only literals and float("nan"/"inf")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert all(isinstance(c.func, ast.Name) and c.func.id == "float" for c in calls)
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Attribute, ast.Subscript, ast.Lambda))]
    assert _same(eval(code, {"__builtins__": {"float": float}}), value)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_doc_text_cannot_end_a_docstring(text) -> None:
    module = f'"""Train {safe.doc_text(text)}.\n\n{safe.doc_text(text)}\n"""\nx = 1\n'
    tree = ast.parse(module)
    assert len(tree.body) == 2 and isinstance(tree.body[1], ast.Assign)
    doc = ast.get_docstring(tree, clean=False)
    assert doc.count("\n") == 3  # the text's own newlines show as escapes
    if text.isascii() and text.isprintable():
        assert doc == f"Train {text}.\n\n{text}\n"


# ---- a user's module fused: its children's names are data ----------------------------------------

def test_a_user_mlp_fused_calls_its_children_by_names_held_as_strings(tmp_path) -> None:
    """A Hugging Face Llama's plan with swiglu, and the same plan with children named "0", "1", "2" (an
    nn.Sequential MLP: valid module paths, no identifiers): each script compiles, the names are the string
    constants of ``fused_submodules``, and none is code (a name or an attribute)."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=128, max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    hf = api.autoparallelize(model, "h100-sxm:1x2", global_batch=4, seq_len=16, fixed={"dp": 2, "tp": 1, "pp": 1})
    assert hf.fusions == ("swiglu",)
    indexed = dataclasses.replace(hf, structure={**hf.structure, "mlp_in": ["mlp.0", "mlp.1"], "mlp_out": "mlp.2"})
    for plan, children in ((hf, ("gate_proj", "up_proj", "down_proj")), (indexed, ("0", "1", "2"))):
        path = _via_file(plan, tmp_path, children[0]).emit(tmp_path / f"train-{children[0]}.py", fuse=True)
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & set(children)
        fused = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FusedSwiGLUMLP")
        held = next(n.value for n in fused.body if isinstance(n, ast.Assign) and n.targets[0].id == "fused_submodules")
        assert ast.literal_eval(held) == children


# ---- the kernels module beside a script whose name is no identifier -------------------------------

def _fused_plan() -> api.Plan:
    cfg = zoo.config("llama-tiny").to_dict()
    return api.Plan(model=cfg, cluster="cpu:1x2", global_batch=4, seq_len=16, mesh=ir.Mesh(dp=2),
                    micro_batch_size=2, fusions=("add_rmsnorm", "swiglu"))


@pytest.mark.parametrize("stem, module", [("train-70b", "train_70b_kernels"), ("70b", "m_70b_kernels"),
                                          ("run.v2 é", "run_v2___kernels")])
def test_kernels_module_gets_an_importable_name(tmp_path, monkeypatch, stem, module) -> None:
    path = _fused_plan().emit(tmp_path / f"{stem}.py", fuse=True)
    kernels = tmp_path / f"{module}.py"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{stem}.py", f"{module}.py"])
    source = path.read_text()
    compile(source, str(path), "exec")
    assert f"import {module} as kernels" in source
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    imported = __import__(module)
    assert imported.__file__ == str(kernels) and callable(imported.swiglu) and callable(imported.add_rmsnorm)
    monkeypatch.delitem(sys.modules, module)


def test_cli_emit_names_the_renamed_kernels_module(tmp_path, capsys) -> None:
    plan_file = _fused_plan().save(tmp_path / "plan.json")
    assert main(["emit", str(plan_file), "-o", str(tmp_path / "train-70b.py"), "--fuse"]) == 0
    assert "train_70b_kernels.py" in capsys.readouterr().out and (tmp_path / "train_70b_kernels.py").exists()


# ---- a source that does not compile: refused, and nothing written ----------------------------------

def test_a_script_that_does_not_compile_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(script, "HEADER", '"""Train {name}: {summary} {world_size} {header}\n')  # never closed
    with pytest.raises(ir.InvalidPlanError, match="does not compile.*nothing was written"):
        _fused_plan().emit(tmp_path / "train.py", fuse=True)  # the kernels module was fine
    assert list(tmp_path.iterdir()) == []
    plan_file = _fused_plan().save(tmp_path / "plan.json")
    assert main(["emit", str(plan_file), "-o", str(tmp_path / "train.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not compile" in err and "\n" not in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_kernels_module_that_does_not_compile_is_refused_before_anything_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(fused_module, "generate_module", lambda used, rules: "def swiglu(:\n    pass\n")
    with pytest.raises(ir.InvalidPlanError, match="kernels module.*does not compile"):
        _fused_plan().emit(tmp_path / "train.py", fuse=True)
    assert list(tmp_path.iterdir()) == []
