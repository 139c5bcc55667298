"""A short profile of ``bench/fuzz.py``'s properties (issue 15), in process and fast.

For damaged plan files, model configs, cluster specs, cluster files, profiles and command lines (the
bench's own generators, ``bench/fuzz_cases.py``): ``meshplan`` exits 0 or 2 and never raises, never
hangs (an alarm turns a hang into a failure), accepts no input that ``bench/fuzz_oracle.py`` finds
invalid (a check written apart from ``ir/schema.py``), and an emitted script compiles, runs its module
code and creates no marker file. Every well-typed cross-field change of ``SEMANTIC`` is swept over each
seed plan, so a rule taken out of the loader fails here; hypothesis draws the structural mutations.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import runpy
import signal
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan import api, ir, zoo
from meshplan.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import fuzz_cases  # noqa: E402
import fuzz_oracle  # noqa: E402

LIMIT_S = 20
FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _names(cfg: dict) -> list[str]:
    with torch.device("meta"):
        return [n for n, _ in zoo.build_from_config(cfg).named_parameters()]


def _seed_plans() -> dict[str, dict]:
    gpt, llama = zoo.config("gpt-tiny").to_dict(), zoo.config("llama-tiny").to_dict()
    plans = {
        "gpt": api.Plan(model=gpt, cluster="cpu:1x1", global_batch=2, seq_len=16, mesh=ir.Mesh(), micro_batch_size=2,
                        recompute=("none",) * 4, source={"kind": "zoo", "name": "gpt-tiny"}),
        "llama-tp": api.Plan(model=llama, cluster="cpu:1x4", global_batch=4, seq_len=16, mesh=ir.Mesh(dp=2, tp=2),
                             micro_batch_size=2, sequence_parallel=True, recompute=("selective",) * 4,
                             fusions=("add_rmsnorm", "swiglu"), source={"kind": "zoo", "name": "llama-tiny"}),
        "gpt-pp": api.Plan(model=gpt, cluster="cpu:1x2", global_batch=4, seq_len=16, mesh=ir.Mesh(pp=2),
                           micro_batch_size=1, num_microbatches=4, stages=((0, 2), (2, 4)), recompute=("full",) * 4),
    }
    out = {}
    for name, plan in plans.items():
        d = plan.to_dict()
        d["param_layouts"] = {n: ["R"] * 5 for n in _names(plan.model)}
        out[name] = d
    return out


SEEDS = _seed_plans()
SHAPES: dict[str, dict | None] = {}


def _shapes(plan) -> dict | None:
    cfg = plan.get("model") if isinstance(plan, dict) else None
    if not isinstance(cfg, dict) or fuzz_oracle.model_violations(cfg) or cfg.get("layers", 99) > 8 \
            or cfg.get("hidden", 10**9) > 1024 or (plan.get("source") or {}).get("kind", "zoo") != "zoo":
        return None
    key = json.dumps(cfg, sort_keys=True)
    if key not in SHAPES:
        try:
            with torch.device("meta"):
                SHAPES[key] = {n: tuple(p.shape) for n, p in zoo.build_from_config(cfg).named_parameters()}
        except ir.PlanError:
            SHAPES[key] = None
    return SHAPES[key]


def _alarm(signum, frame):
    raise TimeoutError(f"a case ran past {LIMIT_S} s")


def run_case(case: dict, where: Path) -> None:
    """The case's command in this process, in ``where``; asserts the properties of the module docstring."""
    where.mkdir(parents=True, exist_ok=True)
    for name, content in case["files"].items():
        path = where / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content[0] == "symlink":
            path.symlink_to(content[1])
        elif content[0] == "dir":
            path.mkdir()
        elif content[0] == "fifo":
            os.mkfifo(path)
        elif content[0] == "sparse":
            with open(path, "wb") as f:
                f.truncate(content[1])
    cwd, err = os.getcwd(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        os.chdir(where)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                rc = main(case["argv"])
            except SystemExit as exc:  # argparse's usage error
                rc = exc.code
        assert rc in (0, 2), (case["what"], rc, err.getvalue()[-500:])
        if rc == 0:
            assert not case["violations"], f"accepted {case['what']!r} although {case['violations']}"
            if case["emit"]:
                script = where / case["out"]
                compile(script.read_bytes(), str(script), "exec")
                plan = json.loads((where / "plan.json").read_bytes())
                if plan.get("source", {}).get("kind") != "builder":  # the user's package may live elsewhere
                    runpy.run_path(str(script), run_name="emitted")
        else:
            assert err.getvalue().startswith("meshplan: error: ") or "usage:" in err.getvalue(), err.getvalue()[-500:]
        assert not (where / fuzz_cases.MARKER).exists(), f"{case['what']!r} ran its payload"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_every_cross_field_change_is_refused_or_valid(seed, tmp_path) -> None:
    for index in range(len(fuzz_cases.SEMANTIC)):
        data, raw, what = fuzz_cases.semantic(SEEDS[seed], index)
        violations = fuzz_oracle.plan_violations(data, param_shapes=_shapes(data))
        case = fuzz_cases._case("plan", f"{seed}: {what}", ["emit", "plan.json", "-o", "train-70b.py"],
                                {"plan.json": raw}, violations, emit=True, out="train-70b.py")
        run_case(case, tmp_path / str(index))


@FAST
@given(st.integers(0, 2**32))
def test_damaged_plan_files(tmp_path, rng_seed) -> None:
    case = fuzz_cases.plan_case(SEEDS, _shapes, random.Random(rng_seed), allow_run=False)
    run_case(case, tmp_path / str(rng_seed))


@FAST
@given(st.sampled_from(("cluster spec", "cluster file", "profile", "cli", "config")), st.integers(0, 2**32))
def test_damaged_clusters_profiles_configs_and_flags(tmp_path, kind, rng_seed) -> None:
    rng = random.Random(rng_seed)
    sys.path.insert(0, str(Path(fuzz_cases.__file__).parent))
    import fuzz

    cases = {"cluster spec": lambda: fuzz_cases.cluster_spec_case(rng),
             "cluster file": lambda: fuzz_cases.file_case("cluster file", fuzz.cluster_file_seeds(), rng),
             "profile": lambda: fuzz_cases.file_case("profile", fuzz.profile_seeds(), rng),
             "cli": lambda: fuzz_cases.cli_case(json.dumps(SEEDS["gpt"]).encode(), rng),
             "config": lambda: fuzz_cases.config_case(rng)}
    case = cases[kind]()
    if case is None or case["argv"][0] == "run" and not case["violations"] or case["argv"][0] == "plan":
        return  # the solver and torchrun take seconds: the bench covers them
    if kind == "config" and not case["violations"]:
        if "config.json" in case["files"]:
            return  # a Hugging Face config within the bounds builds a transformers model: the bench covers it
        if json.loads(case["files"]["cfg.json"])["layers"] > 8:
            return  # a valid deep model (up to the 1024-layer bound) builds for seconds: the bench covers it
    run_case(case, tmp_path / str(rng_seed))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["source"].update(name="nope"), "unknown model 'nope'"),
    (lambda d: d["param_layouts"].update({"layers.0.attn.nope.weight": ["R"] * 5}), "does not have"),
    # fuzz finding: a parameter's layout removed reached the workers, which refused it with a traceback each
    (lambda d: d["param_layouts"].pop("layers.1.mlp_norm.weight"), "no layout for 'layers.1.mlp_norm.weight'"),
])
def test_run_refuses_a_plan_the_zoo_cannot_build_before_torchrun(tmp_path, capsys, edit, message) -> None:
    """Fuzz finding: ``meshplan run`` started torchrun on such a plan and every worker died with a traceback."""
    data = json.loads(json.dumps(SEEDS["gpt"]))
    edit(data)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert main(["run", str(tmp_path / "plan.json"), "--nproc", "1", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshplan: error: ") and message in err and "Traceback" not in err and "torchrun" not in err


def test_emit_refuses_a_zoo_plan_whose_model_lost_a_field(tmp_path, capsys) -> None:
    """Fuzz finding: a plan whose model lacked max_seq_len (renamed to a payload key) was emitted, although
    the zoo model its source names has one; a field the plan's model lacks now disagrees with the zoo's."""
    data = json.loads(json.dumps(SEEDS["gpt"]))
    data["model"]["\\\"\"\"; __import__('os').system('touch PWNED')"] = data["model"].pop("max_seq_len")
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert main(["emit", str(tmp_path / "plan.json"), "-o", str(tmp_path / "train.py")]) == 2
    err = capsys.readouterr().err
    assert "plan.model.max_seq_len is 'missing' but the zoo model the source names has 128" in err
    assert not (tmp_path / "train.py").exists() and not (tmp_path / fuzz_cases.MARKER).exists()
