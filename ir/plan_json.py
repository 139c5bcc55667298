"""Validation of a plan read from JSON: every field checked, with where it went wrong.

Only plain data is read (``json.loads``); nothing is imported or executed from the file.
"""
from __future__ import annotations

from typing import Any

from .errors import InvalidPlanError
from .placement import parse_placement

_REQUIRED = ("model", "cluster", "global_batch", "seq_len", "mesh")
_INT_FIELDS = ("global_batch", "seq_len", "zero_stage", "zero_group", "micro_batch_size", "num_microbatches", "vp")


def _fail(where: str, key: str, msg: str) -> InvalidPlanError:
    return InvalidPlanError(f"{where}: {key}: {msg}")


def _int(value: Any, where: str, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(where, key, f"expected an integer, got {value!r}")
    return value


def _number_dict(value: Any, where: str, key: str) -> dict[str, float]:
    if not isinstance(value, dict) or not all(isinstance(v, (int, float)) for v in value.values()):
        raise _fail(where, key, f"expected an object of numbers, got {value!r}")
    return {str(k): float(v) for k, v in value.items()}


def plan_kwargs_from_dict(data: Any, *, where: str) -> dict[str, Any]:
    from .plan import SCHEMA, Mesh, Prediction, SolverInfo

    if not isinstance(data, dict):
        raise InvalidPlanError(f"{where}: expected a JSON object at the top, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise _fail(where, "schema", f"this meshplan reads {SCHEMA!r}, the file says {schema!r}; "
                    "re-plan with this version (meshplan plan ... -o FILE)")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise InvalidPlanError(f"{where}: missing field(s) {missing}")
    known = set(_REQUIRED) | set(_INT_FIELDS) | {"schema", "sequence_parallel", "schedule", "recompute", "stages",
                                                 "param_layouts", "fusions", "dtype", "prediction", "solver",
                                                 "source", "structure"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidPlanError(f"{where}: unknown field(s) {unknown}; expected only {sorted(known)}")
    kw: dict[str, Any] = {}
    for key in _INT_FIELDS:
        if key in data:
            kw[key] = _int(data[key], where, key)
    if not isinstance(data["model"], dict):
        raise _fail(where, "model", f"expected an object (the model config), got {data['model']!r}")
    kw["model"] = dict(data["model"])
    if not isinstance(data["cluster"], str):
        raise _fail(where, "cluster", f"expected a string such as 'h100-sxm:8x8', got {data['cluster']!r}")
    kw["cluster"] = data["cluster"]
    mesh = data["mesh"]
    if not isinstance(mesh, dict) or set(mesh) - {"pp", "dp", "cp", "tp", "ep"}:
        raise _fail(where, "mesh", f"expected an object with axes among pp, dp, cp, tp, ep, got {mesh!r}")
    kw["mesh"] = Mesh(**{k: _int(v, where, f"mesh.{k}") for k, v in mesh.items()})
    if "sequence_parallel" in data:
        if not isinstance(data["sequence_parallel"], bool):
            raise _fail(where, "sequence_parallel", f"expected true or false, got {data['sequence_parallel']!r}")
        kw["sequence_parallel"] = data["sequence_parallel"]
    for key in ("schedule", "dtype"):
        if key in data:
            if not isinstance(data[key], str):
                raise _fail(where, key, f"expected a string, got {data[key]!r}")
            kw[key] = data[key]
    if "recompute" in data:
        rc = data["recompute"]
        if not isinstance(rc, list) or not all(r in ("none", "selective", "full") for r in rc):
            raise _fail(where, "recompute", "expected a list of 'none' | 'selective' | 'full', one per layer")
        kw["recompute"] = tuple(rc)
    if "stages" in data:
        st = data["stages"]
        if not isinstance(st, list) or not all(isinstance(s, list) and len(s) == 2 for s in st):
            raise _fail(where, "stages", f"expected a list of [first, last) layer pairs, got {st!r}")
        kw["stages"] = tuple((_int(a, where, "stages"), _int(b, where, "stages")) for a, b in st)
    if "param_layouts" in data:
        pl = data["param_layouts"]
        if not isinstance(pl, dict):
            raise _fail(where, "param_layouts", "expected an object of name -> placements")
        layouts = {}
        for name, placements in pl.items():
            if not isinstance(placements, list):
                raise _fail(where, f"param_layouts[{name!r}]", "expected a list of placements like 'S(0)', 'R'")
            for p in placements:
                try:
                    parse_placement(p)
                except (ValueError, TypeError) as exc:
                    raise _fail(where, f"param_layouts[{name!r}]", str(exc)) from None
            layouts[name] = tuple(placements)
        kw["param_layouts"] = layouts
    if "fusions" in data:
        if not isinstance(data["fusions"], list) or not all(isinstance(f, str) for f in data["fusions"]):
            raise _fail(where, "fusions", "expected a list of strings")
        kw["fusions"] = tuple(data["fusions"])
    for key in ("source", "structure"):
        if key in data:
            if not isinstance(data[key], dict):
                raise _fail(where, key, f"expected an object, got {data[key]!r}")
            kw[key] = dict(data[key])
    if data.get("prediction") is not None:
        kw["prediction"] = _prediction(data["prediction"], where, Prediction)
    if data.get("solver") is not None:
        kw["solver"] = _solver(data["solver"], where, SolverInfo)
    try:
        from .plan import Schedule
        if "schedule" in kw:
            Schedule(kw["schedule"])
    except ValueError:
        raise _fail(where, "schedule", f"expected one of gpipe, 1f1b, interleaved-1f1b, zero-bubble, "
                    f"got {kw['schedule']!r}") from None
    return kw


def _prediction(p: Any, where: str, cls: type) -> Any:
    if not isinstance(p, dict):
        raise _fail(where, "prediction", "expected an object")
    scalars = ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
               "peak_memory_bytes")
    kw: dict[str, Any] = {}
    for key in scalars:
        if not isinstance(p.get(key), (int, float)) or isinstance(p.get(key), bool):
            raise _fail(where, f"prediction.{key}", f"expected a number, got {p.get(key)!r}")
        kw[key] = float(p[key])
    for key in ("memory_bytes", "time_s"):
        kw[key] = _number_dict(p.get(key), where, f"prediction.{key}")
    if "memory_limit_bytes" in p:
        kw["memory_limit_bytes"] = float(p["memory_limit_bytes"])
    if "comm_bytes" in p:
        kw["comm_bytes"] = _number_dict(p["comm_bytes"], where, "prediction.comm_bytes")
    return cls(**kw)


def _solver(s: Any, where: str, cls: type) -> Any:
    if not isinstance(s, dict):
        raise _fail(where, "solver", "expected an object")
    if not isinstance(s.get("status"), str):
        raise _fail(where, "solver.status", f"expected a string, got {s.get('status')!r}")
    for key in ("wall_s", "gap"):
        if not isinstance(s.get(key), (int, float)):
            raise _fail(where, f"solver.{key}", f"expected a number, got {s.get(key)!r}")
    kw = {"status": s["status"], "wall_s": float(s["wall_s"]), "gap": float(s["gap"])}
    for key in ("candidates", "pruned", "variables", "constraints", "intra_op_variables", "intra_op_constraints"):
        if key in s:
            kw[key] = _int(s[key], where, f"solver.{key}")
    if "phases" in s:
        kw["phases"] = _number_dict(s["phases"], where, "solver.phases")
    for key in ("binding", "intra_op"):
        if key in s:
            kw[key] = str(s[key])
    if "alternatives" in s:
        if not isinstance(s["alternatives"], list) or not all(isinstance(a, dict) for a in s["alternatives"]):
            raise _fail(where, "solver.alternatives", "expected a list of objects")
        kw["alternatives"] = tuple(s["alternatives"])
    return cls(**kw)
