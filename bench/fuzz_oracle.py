"""What a fuzzed input must satisfy to be accepted, checked independently of meshplan's own validation.

``bench/fuzz.py`` counts an input that meshplan accepts (exit 0) although one of these checks finds a
violation as an *invalid input accepted*. The checks are written from the plan file's documented rules
(``ir/plan.py``, ``../shared/DESIGN.md``) and from the model itself (a zoo model built on the meta device
names its real parameters), not by calling ``ir/schema.py``, so that a rule the schema forgets shows up.

Each function returns a list of violations in words; an empty list means "valid".
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

MAX_GPUS, MAX_LAYERS, MAX_BATCH, MAX_SEQ = 10**7, 1024, 2**40, 2**24  # as ir/limits.py documents
AXES = ("pp", "dp", "cp", "tp", "ep")
PLAN_FIELDS = {"schema", "model", "cluster", "global_batch", "seq_len", "mesh", "zero_stage", "zero_group",
               "sequence_parallel", "micro_batch_size", "num_microbatches", "schedule", "vp", "recompute", "stages",
               "param_layouts", "fusions", "dtype", "software", "source", "structure", "prediction", "solver"}
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
RECOMPUTE = ("none", "selective", "full", "offload")
DTYPES = ("bfloat16", "float16", "float32")
MODEL_INTS = {"layers": (1, MAX_LAYERS), "hidden": (1, 2**20), "heads": (1, 2**14), "kv_heads": (0, 2**14),
              "ffn_hidden": (0, 2**22), "vocab": (1, 2**24), "max_seq_len": (1, MAX_SEQ), "experts": (0, 2**14),
              "top_k": (0, 2**14), "head_dim": (0, 2**14)}
CONFIG_FIELDS = (*MODEL_INTS, "family", "name")  # a model config's fields (DESIGN.md: zoo.ModelConfig)
PRESETS = tuple(p.stem for p in (Path(__file__).resolve().parents[1] / "cost_model" / "presets").glob("*.json"))
PLACEMENT = re.compile(r"^(R|P|S\((\d)\))$")


def is_int(v: Any, least: int, most: int) -> bool:
    return type(v) is int and least <= v <= most


def finite(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def strict_json(raw: bytes) -> tuple[Any, str | None]:
    """The file's JSON value, or the reason it is none: not UTF-8, not JSON, non-finite numbers,
    integers too long, nesting deeper than 64."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    if re.search(r"\d{41}", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)):
        return None, "an integer over 40 digits"

    def constant(name: str) -> Any:
        raise ValueError(name)

    old = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(old, 20000))
        data = json.loads(text, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        return None, f"not strict JSON ({type(exc).__name__})"
    finally:
        sys.setrecursionlimit(old)
    if _depth(data) > 64:
        return None, "nested over 64 deep"
    if not _all_finite(data):
        return None, "a non-finite number"
    return data, None


def _depth(v: Any) -> int:
    depth, level = 0, [v]
    while level:
        depth += 1
        level = [x for item in level if isinstance(item, (dict, list))
                 for x in (item.values() if isinstance(item, dict) else item)]
    return depth - 1


def _all_finite(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, dict):
        return all(_all_finite(x) for x in v.values())
    if isinstance(v, list):
        return all(_all_finite(x) for x in v)
    return True


def model_violations(cfg: Any, *, zoo_family: bool = True) -> list[str]:
    """A zoo model config (``--model-config`` or a plan's ``model``)."""
    if not isinstance(cfg, dict):
        return ["model is not an object"]
    bad = [f"model.{k} = {cfg[k]!r:.40} not an int in {lo}..{hi}" for k, (lo, hi) in MODEL_INTS.items()
           if k in cfg and not is_int(cfg[k], lo, hi)]
    if bad:
        return bad
    if zoo_family and cfg.get("family") not in ("gpt", "llama", "moe"):
        bad.append(f"family {cfg.get('family')!r:.40} unknown")
    if zoo_family and not all(k in cfg for k in ("layers", "hidden", "heads", "vocab")):
        bad.append("model lacks layers/hidden/heads/vocab")
    hidden, heads, kv = cfg.get("hidden"), cfg.get("heads"), cfg.get("kv_heads")
    if hidden and heads and hidden % heads:
        bad.append("hidden % heads")
    if heads and kv and heads % kv:
        bad.append("heads % kv_heads")
    if "top_k" in cfg and cfg.get("top_k", 0) > cfg.get("experts", 0):
        bad.append("top_k > experts")
    if cfg.get("family") == "moe" and not (cfg.get("experts", 0) >= 1 and cfg.get("top_k", 0) >= 1):
        bad.append("a moe without experts or top_k")
    return bad


def plan_violations(data: Any, *, param_shapes: dict[str, tuple[int, ...]] | None = None) -> list[str]:
    """A plan file's value against the rules of ``ir/plan.py`` and the model's real parameters
    (``param_shapes``: name -> shape of the model the plan names, when it can be built)."""
    if not isinstance(data, dict):
        return ["not an object"]
    bad = [f"unknown field {k!r:.40}" for k in data if k not in PLAN_FIELDS]
    bad += [f"missing {k}" for k in ("schema", "model", "cluster", "global_batch", "seq_len", "mesh") if k not in data]
    if bad:
        return bad
    if data["schema"] != "meshplan.plan/1":
        bad.append("schema")
    mesh = data["mesh"]
    if not isinstance(mesh, dict) or set(mesh) - set(AXES) or not all(is_int(v, 1, MAX_GPUS) for v in mesh.values()):
        return bad + ["mesh"]
    pp, dp, cp, tp, ep = (mesh.get(a, 1) for a in AXES)
    g = {k: data.get(k, d) for k, d in (("zero_stage", 0), ("zero_group", 0), ("sequence_parallel", False),
                                         ("micro_batch_size", 1), ("num_microbatches", 1), ("schedule", "1f1b"),
                                         ("vp", 1), ("recompute", []), ("stages", []), ("param_layouts", {}),
                                         ("fusions", []), ("dtype", "bfloat16"), ("software", "meshplan"), ("source", {}),
                                         ("structure", {}))}
    checks = [
        (is_int(data["global_batch"], 1, MAX_BATCH), "global_batch"),
        (is_int(data["seq_len"], 1, MAX_SEQ), "seq_len"),
        (type(g["zero_stage"]) is int and g["zero_stage"] in (0, 1, 2, 3), "zero_stage"),
        (is_int(g["zero_group"], 0, MAX_GPUS), "zero_group"),
        (type(g["sequence_parallel"]) is bool, "sequence_parallel type"),
        (is_int(g["micro_batch_size"], 1, MAX_BATCH), "micro_batch_size"),
        (is_int(g["num_microbatches"], 1, MAX_BATCH), "num_microbatches"),
        (g["schedule"] in SCHEDULES, "schedule"),
        (is_int(g["vp"], 1, MAX_LAYERS), "vp"),
        (g["dtype"] in DTYPES, "dtype"),
        (isinstance(g["software"], str) and re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,63}", g["software"]) is not None,
         "software"),
        (isinstance(g["recompute"], list) and all(r in RECOMPUTE for r in g["recompute"]), "recompute values"),
        (isinstance(g["fusions"], list) and all(isinstance(f, str) for f in g["fusions"]), "fusions type"),
        (isinstance(g["param_layouts"], dict), "param_layouts type"),
        (isinstance(g["stages"], list) and all(isinstance(s, list) and len(s) == 2 and all(is_int(x, 0, MAX_LAYERS)
                                                                                          for x in s)
                                               for s in g["stages"]), "stages type"),
        (isinstance(g["structure"], dict), "structure type"),
        (isinstance(g["source"], dict), "source type"),
    ]
    bad += [why for ok, why in checks if not ok]
    if bad:
        return bad
    bad += model_violations(data["model"], zoo_family=_is_zoo(g["source"], data["model"]))
    if bad:
        return bad
    cfg = data["model"]
    bad += _cluster_violations(data["cluster"], pp * dp * cp * tp)
    if g["micro_batch_size"] * g["num_microbatches"] * dp != data["global_batch"]:
        bad.append("micro_batch_size * num_microbatches * dp != global_batch")
    if (tp * dp * cp) % ep:
        bad.append("ep does not divide tp * dp * cp")
    if g["sequence_parallel"] and tp == 1:
        bad.append("sequence_parallel with tp 1")
    if data["seq_len"] % (cp * (tp if g["sequence_parallel"] else 1)):
        bad.append("seq_len does not divide by cp (* tp)")
    if "max_seq_len" in cfg and data["seq_len"] > cfg["max_seq_len"]:
        bad.append("seq_len > max_seq_len")
    zs, zg = g["zero_stage"], g["zero_group"]
    if zg and (zs not in (2, 3) or not 1 < zg < dp or dp % zg):
        bad.append("zero_group")
    if g["vp"] > 1 and (g["schedule"] != "interleaved-1f1b" or pp == 1):
        bad.append("vp > 1 without interleaved-1f1b or without pp > 1")
    if tp > 1 and cfg.get("heads") and (cfg["heads"] % tp or (cfg.get("kv_heads") or cfg["heads"]) % tp):
        bad.append("tp does not divide the heads")
    if ep > 1 and cfg.get("experts", 0) % ep:
        bad.append("ep does not divide the experts")
    bad += _stage_violations(g["stages"], g["recompute"], cfg.get("layers"), pp, g["vp"])
    from meshplan.codegen.kernels.patterns import BY_NAME  # the fusions codegen can generate

    if len(set(g["fusions"])) != len(g["fusions"]) or not set(g["fusions"]) <= set(BY_NAME):
        bad.append("fusions")
    bad += _layout_violations(g["param_layouts"], param_shapes)
    bad += _source_violations(g["source"], cfg)
    pred = data.get("prediction")
    if pred is not None and not (isinstance(pred, dict) and _nonneg_numbers(pred)):
        bad.append("prediction not finite and non-negative")
    solver = data.get("solver")
    if solver is not None and not (isinstance(solver, dict) and _nonneg_numbers(solver)):
        bad.append("solver numbers not finite and non-negative")
    return bad


def _is_zoo(source: dict, model: Any) -> bool:
    return source.get("kind", "zoo") == "zoo" or (isinstance(model, dict) and "family" in model)


def cluster_violations(spec: Any) -> list[str]:
    """A ``--cluster`` spec of the NAME[:NODESxGPUS] form (files aside)."""
    return _cluster_violations(spec, None)


def _cluster_violations(spec: Any, world: int | None) -> list[str]:
    if not isinstance(spec, str):
        return ["cluster not a string"]
    spec = spec.strip()
    if spec.endswith(".json"):
        return []
    hit = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._\-]*)(?::([0-9]+)x([0-9]+))?", spec)
    if hit is None:
        return [f"cluster {spec!r:.40} does not parse"]
    if hit.group(1) not in PRESETS:
        return [f"cluster preset {hit.group(1)!r:.40} unknown"]
    if hit.group(2) is None:
        return []
    nodes, gpus = int(hit.group(2)[:12]), int(hit.group(3)[:12])
    if not 1 <= nodes * gpus <= MAX_GPUS or nodes < 1 or gpus < 1:
        return ["cluster size out of range"]
    if world is not None and nodes * gpus != world:
        return ["mesh does not fill the cluster"]
    return []


def _stage_violations(stages: list, recompute: list, layers: int | None, pp: int, vp: int) -> list[str]:
    bad = []
    if layers is not None and recompute and len(recompute) != layers:
        bad.append("recompute length != layers")
    if pp > 1 and not stages:
        bad.append("pp > 1 without stages")
    if stages:
        if len(stages) != pp * vp:
            bad.append("stage count != pp * vp")
        expect = 0
        for c, (first, last) in enumerate(stages):
            ends = c in (0, len(stages) - 1) and len(stages) > 1
            if first != expect or last < first or (last == first and not ends):
                bad.append("stages out of order")
                break
            expect = last
        total = layers if layers is not None else len(recompute) or None
        if total is not None and expect != total:
            bad.append("stages do not cover the layers")
    return bad


def _layout_violations(layouts: dict, shapes: dict[str, tuple[int, ...]] | None) -> list[str]:
    bad = []
    for name, layout in layouts.items():
        if not isinstance(layout, list) or len(layout) != len(AXES):
            bad.append(f"layout of {name!r:.40} is not 5 placements")
            continue
        hits = [PLACEMENT.match(p) if isinstance(p, str) else None for p in layout]
        if not all(hits):
            bad.append(f"layout of {name!r:.40} has a bad placement")
            continue
        if shapes is not None:
            if name not in shapes:
                bad.append(f"layout names {name!r:.60}, not a parameter of the model")
            elif any(h.group(2) is not None and int(h.group(2)) >= len(shapes[name]) for h in hits):
                bad.append(f"layout of {name!r:.40} shards a dim the parameter lacks")
    return bad


def _source_violations(source: dict, model: dict) -> list[str]:
    kind = source.get("kind") if source else None
    if not source:
        return []
    if kind == "zoo":
        from meshplan import zoo

        if ("name" in source) == ("config" in source) or set(source) - {"kind", "name", "config"}:
            return ["zoo source: name xor config"]
        if "name" in source:
            if source["name"] not in zoo.names():
                return [f"zoo source names {source['name']!r:.40}, not a zoo model"]
            known = zoo.config(source["name"]).to_dict()
            if any(model.get(k) != v for k, v in known.items() if k in MODEL_INTS or k == "family"):
                return ["zoo source and model disagree"]
        return []
    if kind == "module":
        return ["source module: no model to emit or run"]
    if kind == "builder":
        target = source.get("target")
        if not isinstance(target, str) or target.partition(":")[0].split(".")[0] in sys.stdlib_module_names:
            return [f"builder target {target!r:.40} is the standard library, not a model builder"]
        return []
    if kind == "hf":
        return [] if isinstance(source.get("config"), dict) else ["hf source without a config"]
    return [f"source kind {kind!r:.40}"]


def _nonneg_numbers(v: Any) -> bool:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return True
    if isinstance(v, (int, float)):
        return math.isfinite(v) and v >= 0
    if isinstance(v, dict):
        return all(_nonneg_numbers(x) for x in v.values())
    if isinstance(v, list):
        return all(_nonneg_numbers(x) for x in v)
    return False


def file_numbers_violations(data: Any, *, allow_negative: tuple[str, ...] = ()) -> list[str]:
    """A cluster file or profile: every number finite and non-negative, never a boolean where the
    original had a number (the caller compares against the seed: ``type_changes``)."""
    bad = []

    def walk(v: Any, path: str) -> None:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return
        if isinstance(v, (int, float)):
            if not math.isfinite(v) or (v < 0 and not path.endswith(allow_negative)):
                bad.append(f"{path} = {v!r:.30}")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")

    walk(data, "")
    return bad


def type_changes(seed: Any, data: Any, path: str = "") -> list[str]:
    """Where ``data`` holds a value of another JSON type than ``seed`` at the same place (keys both have),
    ints and floats counted as one type, and keys ``seed`` lacks (an unknown field)."""
    def kind(v: Any) -> str:
        return "num" if type(v) in (int, float) else type(v).__name__

    if kind(seed) != kind(data):
        return [f"{path or 'top'}: {kind(seed)} -> {kind(data)}"]
    if isinstance(seed, dict):
        out = [f"{path}.{k}: unknown key" for k in data if k not in seed]
        for k in seed:
            if k in data:
                out += type_changes(seed[k], data[k], f"{path}.{k}")
        return out
    if isinstance(seed, list) and seed and data:
        return [x for item in data for x in type_changes(seed[0], item, f"{path}[]")]
    return []
