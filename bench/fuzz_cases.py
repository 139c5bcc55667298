"""The inputs ``bench/fuzz.py`` feeds meshplan: mutations of valid plans, model configs, cluster specs,
cluster files, calibrated profiles and command lines, each with what ``fuzz_oracle`` says of it.

A case is a plain dict (it crosses a process pool): ``kind``, ``what`` (the mutation, in words),
``argv`` (the ``meshplan`` command), ``files`` (name -> bytes, or a special file: ``("fifo",)``,
``("symlink", target)``, ``("dir",)``, ``("sparse", size)``), ``violations`` (the oracle's findings:
non-empty means meshplan must refuse) or ``None`` where the oracle cannot tell, and ``emit`` (for plan
cases: the emitted script is then compiled and run). Payloads create the file ``PWNED`` in the case's
directory if they ever run.
"""
from __future__ import annotations

import copy
import json
import random
from typing import Any, Callable

from fuzz_oracle import (CONFIG_FIELDS, MODEL_INTS, cluster_violations, file_numbers_violations, is_int,
                         model_violations, plan_violations, strict_json, type_changes)

MARKER = "PWNED"
PAYLOADS = (
    f'"; __import__("os").system("touch {MARKER}") #',
    f'"""\nimport os; os.system("touch {MARKER}")\n"""',
    f"'''\nimport os; os.system('touch {MARKER}')\n'''",
    f'\\"""; __import__("os").system("touch {MARKER}"); """',
    f'x"""\r__import__("os").system("touch {MARKER}")#',
    f"\u2028__import__('os').system('touch {MARKER}')",
    f'é"}}; __import__("os").system("touch {MARKER}"); {{"',
    f"{{__import__('os').system('touch {MARKER}')}}",
    f"\n__import__('os').system('touch {MARKER}')\n#",
    f"layers.0.attn.wq.weight\"]);__import__('os').system('touch {MARKER}');#",
    "\\", '"', "\x00", "", " ", "-" * 5000,
)
ODD_VALUES = (True, False, None, "4", 2.0, 0.5, -1, 0, 10**30, [], {}, [1, 2], {"a": 1}, "x", -0.0, 1e308, 2**63)
ODD_FLAG_VALUES = ("0", "-1", "nan", "inf", "-inf", "1e9", "99999999999999999999", "abc", "", "2**63",
                   "9223372036854775808", "1.5", " 3", "\u0663", "1_000", "4" * 5000, "0x10", "-0", "+2")

# -------------------------------------------------------------------------------------------------
# generic JSON mutations


def _paths(v: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(v, dict):
        for k, x in v.items():
            out += _paths(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _paths(x, path + (i,))
    return out


def _get(v: Any, path: tuple) -> Any:
    for p in path:
        v = v[p]
    return v


def _set(v: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(v, path[:-1])[path[-1]] = value
    return v


def _leaf_paths(data: Any, want: type | tuple) -> list[tuple]:
    return [p for p in _paths(data) if p and isinstance(_get(data, p), want) and not isinstance(_get(data, p), bool)
            or p and want is bool and isinstance(_get(data, p), bool)]


def _dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


MARK = "\x01MARK\x01"  # replaced in the text by a raw literal JSON cannot hold as a value (NaN, 10^5000 ...)


def _text_level(data: Any, rng: random.Random) -> tuple[bytes, str]:
    """A number replaced by a literal only text can carry, or the bytes broken."""
    data = copy.deepcopy(data)
    nums = _leaf_paths(data, (int, float)) or [p for p in _paths(data) if p]
    path = rng.choice(nums) if nums else ()
    choice = rng.randrange(9)
    if choice <= 3:
        literal = ("NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000, "1" + "0" * 45, "1e-999",
                   "[" * 5000 + "]" * 5000)[rng.randrange(9)]
        raw = _dumps(_set(data, path, MARK)).replace(json.dumps(MARK).encode(), literal.encode())
        return raw, f"{'.'.join(map(str, path))} = {literal[:12]}"
    raw = _dumps(data)
    if choice == 4:
        cut = rng.randrange(len(raw))
        return raw[:cut], f"truncated at {cut} of {len(raw)} bytes"
    if choice == 5:
        at = rng.randrange(len(raw))
        junk = rng.choice((b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", "é".encode("latin-1")))
        return raw[:at] + junk + raw[at:], f"non-UTF-8 bytes {junk!r} at {at}"
    if choice == 6:
        depth = rng.choice((65, 200, 5000, 100_000))
        raw = _dumps(_set(data, path, MARK)).replace(json.dumps(MARK).encode(), b"[" * depth + b"1" + b"]" * depth)
        return raw, f"{'.'.join(map(str, path))} nested {depth} deep"
    if choice == 7:
        return b"\xef\xbb\xbf" + raw, "a UTF-8 byte-order mark"
    return raw.replace(b",", b",\x00", 1), "a NUL byte in the text"


def mutate_json(seed: Any, rng: random.Random, *, strings: bool = True) -> tuple[Any, bytes, str]:
    """(value or None, file bytes, description): one structural mutation of ``seed``."""
    data = copy.deepcopy(seed)
    paths = [p for p in _paths(data) if p]
    choice = rng.randrange(12)
    if choice == 0 or not paths:
        raw, what = _text_level(data, rng)
        return strict_json(raw)[0], raw, what
    path = rng.choice(paths)
    where = ".".join(map(str, path))
    if choice <= 2:
        value = rng.choice(ODD_VALUES)
        _set(data, path, copy.deepcopy(value))
        what = f"{where} = {value!r:.30}"
    elif choice == 3 and strings:
        strs = _leaf_paths(data, str) or paths
        path = rng.choice(strs)
        payload = rng.choice(PAYLOADS)
        _set(data, path, payload)
        what = f"payload in {'.'.join(map(str, path))}"
    elif choice == 4 and strings:
        objs = [p for p in _paths(data) if isinstance(_get(data, p), dict) and _get(data, p)]
        obj = _get(data, rng.choice(objs)) if objs else data
        key = rng.choice(list(obj))
        obj[rng.choice(PAYLOADS)] = obj.pop(key)
        what = f"key {key!r} renamed to a payload"
    elif choice == 5:
        parent = _get(data, path[:-1])
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
        what = f"{where} removed"
    elif choice == 6:
        nums = _leaf_paths(data, (int, float)) or paths
        path = rng.choice(nums)
        old = _get(data, path)
        new = rng.choice((0, -1, -old if isinstance(old, (int, float)) else -1, 2**62, 10**39, 1e300,
                          (old or 1) * 3 if isinstance(old, (int, float)) else 3))
        _set(data, path, new)
        what = f"{'.'.join(map(str, path))}: {old!r:.20} -> {new!r:.20}"
    elif choice == 7:
        if isinstance(data, dict):
            data["extra_field"] = 1
        what = "an unknown top-level field"
    else:
        raw, what = _text_level(data, rng)
        return strict_json(raw)[0], raw, what
    raw = _dumps(data)
    return strict_json(raw)[0], raw, what


SPECIAL_FILES = (("fifo",), ("symlink", "/dev/zero"), ("dir",), ("sparse", 2**27), ("missing",),
                 ("symlink", "/proc/self/mem"), ("empty",))


def special_file(rng: random.Random) -> tuple[Any, str]:
    special = rng.choice(SPECIAL_FILES)
    return (b"" if special == ("empty",) else special), f"the file is {' '.join(map(str, special))}"


# -------------------------------------------------------------------------------------------------
# the kinds


def plan_case(seeds: dict[str, dict], shapes: Any, rng: random.Random, *, allow_run: bool = True) -> dict:
    name = rng.choice(sorted(seeds))
    seed = seeds[name]
    r = rng.random()
    if r < 0.05:
        content, what = special_file(rng)
        return _case("plan", f"{name}: {what}", ["emit", "plan.json", "-o", "out.py"], {"plan.json": content},
                     ["not a regular JSON file"], emit=True)
    if r < 0.30:
        data, raw, what = _semantic(seed, rng)
    else:
        data, raw, what = mutate_json(seed, rng)
    parsed, reason = strict_json(raw)
    violations = [reason] if reason else plan_violations(parsed, param_shapes=shapes(parsed))
    if allow_run and name.endswith("-1") and rng.random() < 0.15:  # one process: `meshplan run` trains a step in seconds
        return _case("plan", f"{name}: {what} (run)", ["run", "plan.json", "--nproc", "1", "--steps", "1"],
                     {"plan.json": raw}, violations)
    out = rng.choice(("out.py", "train-70b.py", "70b.py", "run.v2.py"))
    fuse = rng.choice(((), ("--fuse",), ("--no-fuse",)))
    return _case("plan", f"{name}: {what}", ["emit", "plan.json", "-o", out, *fuse], {"plan.json": raw},
                 violations, emit=True, out=out)


def _put(*path: str) -> Callable[[Any], Callable[[dict], None]]:
    def with_value(value: Any) -> Callable[[dict], None]:
        def put(d: dict) -> None:
            target = d
            for key in path[:-1]:
                if not isinstance(target.get(key), dict):
                    target[key] = {}
                target = target[key]
            target[path[-1]] = copy.deepcopy(value)
        return put
    return with_value


def _layout(name: str, layout: list[str]) -> Callable[[dict], None]:
    return lambda d: d["param_layouts"].__setitem__(name, layout)


def _recompute(delta: int) -> Callable[[dict], None]:
    return lambda d: d.__setitem__("recompute", d["recompute"][:-1] if delta < 0 else d["recompute"] + ["full"])


# well-typed changes that break (or keep) a rule across fields: (what, change in place)
SEMANTIC: tuple[tuple[str, Callable[[dict], None]], ...] = (
    *((f"mesh.{a} = {n}", _put("mesh", a)(n)) for a in ("pp", "dp", "cp", "tp", "ep") for n in (2, 3, 4)),
    *((f"cluster = {c!r}", _put("cluster")(c)) for c in (
        "cpu:1x3", "cpu:2x4", "cpu:0x4", "h100-sxm:1x8", "nope:1x4", "cpu", "cpu:1x4x2", "cpu:1X4", " cpu:1x4 ",
        "../../etc/passwd.json", "/dev/zero.json", "cpu:01x4", "cpu:99999999999999999999x8", "h100-sxm:1250000x8",
        "cpu:\uff11x\uff14".encode().decode("unicode_escape"))),
    *((f"param_layouts[{n!r}] = {lay}", _layout(n, lay)) for n in (
        "layers.0.attn.nope.weight", "layers.99.attn.wq.weight", "nope", "embed.tok.weight", "layers.0.mlp.fc1.weight",
        "output.weight", "layers.-1.x", "layers.0.attn_norm.weight", "layers.x.attn_norm.weight")
      for lay in (["R"] * 5, ["R", "R", "R", "S(1)", "R"], ["S(9)"] + ["R"] * 4)),
    *((f"model.{k} = {v!r}", _put("model", k)(v)) for k, v in (
        ("heads", 0), ("vocab", -5), ("hidden", 65), ("layers", True), ("layers", 5), ("kv_heads", 3), ("top_k", 9),
        ("heads", 3), ("layers", 0), ("hidden", 2**40), ("family", "nope"), ("family", "moe"), ("experts", 3),
        ("max_seq_len", 8), ("layers", "x"), ("heads", 8), ("heads", 64))),
    *((f"stages = {st}", _put("stages")(st)) for st in (
        [[0, 2], [2, 4]], [[0, 3], [2, 4]], [[0, 4]], [[0, 2], [3, 4]], [[0, 0], [0, 4]], [[0, 4], [4, 4]],
        [[0, 2], [2, 5]], [[1, 4]])),
    ("recompute one short", _recompute(-1)), ("recompute one long", _recompute(1)),
    *((f"fusions = {f}", _put("fusions")(f)) for f in (["swiglu", "swiglu"], ["nope"], ["softmax"],
                                                       ["add_rmsnorm", "swiglu"], [""])),
    *((f"dtype = {t}", _put("dtype")(t)) for t in ("float8", "int8", "float16", "float64", "bool", "float32")),
    *((f"source = {json.dumps(src)[:50]}", _put("source")(src)) for src in (
        {"kind": "module"}, {"kind": "zoo", "name": "nope"}, {"kind": "zoo", "name": "llama-tiny"}, {"kind": "zoo"},
        {"kind": "builder", "target": "subprocess:run", "kwargs": {"args": ["touch", MARKER]}},
        {"kind": "builder", "target": "os:system", "kwargs": {"command": f"touch {MARKER}"}},
        {"kind": "builder", "target": "nope.mod:fn"}, {"kind": "hf", "config": {}}, {})),
    *((f"prediction.{k} = {v}", _put("prediction", k)(v)) for k in ("step_time_s", "mfu") for v in (-1.0, 1e300)),
    *((f"global_batch = {b}", _put("global_batch")(b)) for b in (3, 2**40, 2**41)),
    ("sequence_parallel flipped", lambda d: d.__setitem__("sequence_parallel", not d.get("sequence_parallel"))),
    *((f"vp = {vp}, schedule = {sch}", lambda d, vp=vp, sch=sch: d.update(vp=vp, schedule=sch))
      for vp, sch in ((2, "1f1b"), (2, "interleaved-1f1b"), (1, "zero-bubble"), (1, "gpipe"))),
    *((f"zero_stage = {z}, zero_group = {g}", lambda d, z=z, g=g: d.update(zero_stage=z, zero_group=g))
      for z, g in ((1, 2), (3, 2), (3, 4), (2, 0), (3, 0), (0, 0))),
)


def semantic(seed: dict, index: int) -> tuple[Any, bytes, str]:
    """``SEMANTIC[index]`` applied to a copy of ``seed``: (value, file bytes, what)."""
    what, change = SEMANTIC[index]
    d = copy.deepcopy(seed)
    change(d)
    return d, _dumps(d), what


def _semantic(seed: dict, rng: random.Random) -> tuple[Any, bytes, str]:
    return semantic(seed, rng.randrange(len(SEMANTIC)))


CONFIG_SEEDS = ({"family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "max_seq_len": 128},
                {"family": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
                 "vocab": 256, "max_seq_len": 64},
                {"family": "moe", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "experts": 4, "top_k": 2,
                 "max_seq_len": 64})
ESTIMATE = ["--global-batch", "8", "--seq-len", "32"]


# a Hugging Face config (``--model hf:PATH``) and the zoo bound each of its size fields falls under
HF_SEED = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512}
HF_SIZES = {"num_hidden_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
            "num_key_value_heads": "kv_heads", "intermediate_size": "ffn_hidden", "vocab_size": "vocab"}


def hf_config_case(rng: random.Random) -> dict:
    """A Hugging Face config with one size field damaged (the oracle knows the bounds; a value within them
    may still be one transformers refuses, so it counts as "valid" only for sizes that keep the model whole),
    or the config damaged at the text level (then only tracebacks and hangs count)."""
    data = copy.deepcopy(HF_SEED)
    if rng.random() < 0.7:
        key = rng.choice(tuple(HF_SIZES))
        data[key] = rng.choice((0, -5, True, "x", 10**6, 2**40, 3, 1.0, 10**5, 1025))
        lo, hi = MODEL_INTS[HF_SIZES[key]]
        ok = is_int(data[key], lo, hi)
        raw, what = _dumps(data), f"hf {key} = {data[key]!r}"
        # within the bounds, transformers and the trace decide (heads that do not divide ...): None says
        # "unknown", so that only a traceback or a hang is a finding
        violations = None if ok else [f"{key} = {data[key]!r:.40} not an int in {lo}..{hi}"]
    else:
        data, raw, what = mutate_json(data, rng)
        what, violations = "hf " + what, None
    return _case("config", what, ["estimate", "--model", "hf:config.json", "--cluster", "cpu:1x4", *ESTIMATE],
                 {"config.json": raw}, violations)


def config_case(rng: random.Random) -> dict:
    if rng.random() < 0.25:
        return hf_config_case(rng)
    seed = rng.choice(CONFIG_SEEDS)
    if rng.random() < 0.05:
        content, what = special_file(rng)
        raw, violations = content, ["not a regular JSON file"]
    else:
        if rng.random() < 0.4:
            data = copy.deepcopy(seed)
            key = rng.choice(("layers", "hidden", "heads", "vocab", "kv_heads", "top_k", "experts", "max_seq_len"))
            data[key] = rng.choice((0, -5, True, "x", 10**6, 2**40, 3, 65, 1.0, 10**5, 1024, 1025))  # 1024: the layer bound
            raw, what = _dumps(data), f"{key} = {data[key]!r}"
        else:
            data, raw, what = mutate_json(seed, rng)
        parsed, reason = strict_json(raw)
        violations = [reason] if reason else model_violations(parsed)
        # an unknown field is one ModelConfig lacks, not one the seed lacks (kv_heads = 0 on a gpt seed is fine)
        violations += [] if reason or violations else [t for t in type_changes(seed, parsed) if "unknown" in t
                                                       and t.split(":")[0].lstrip(".") not in CONFIG_FIELDS]
    cmd = ["plan", "--time-limit", "2"] if rng.random() < 0.2 else ["estimate"]  # the solver takes seconds
    return _case("config", what, [*cmd, "--model-config", "cfg.json", "--cluster", "cpu:1x4", *ESTIMATE],
                 {"cfg.json": raw}, violations if violations else None)


def cluster_spec_case(rng: random.Random) -> dict:
    name = rng.choice(("cpu", "h100-sxm", "a100-80gb", "gb200-nvl72", "nope", "", "CPU", "cpu ", "-cpu", "é", "a" * 5000))
    nodes, gpus = (rng.choice(("0", "1", "2", "-1", "99999999999999999999", "4" * 5000, "\u0663", "1e3", "", "10000000",
                               "01", "1250000")) for _ in range(2))
    form = rng.randrange(5)
    spec = (f"{name}:{nodes}x{gpus}" if form <= 2 else name if form == 3
            else rng.choice(("cpu:1x4:1", "cpu::4", ":", "x", "cpu:1x", "\n", "cpu:1x4\n", "../x.json", "/dev/zero.json",
                             "/proc/self/fd/0.json", "/nonexistent.json", "cpu:１x４")))
    violations = cluster_violations(spec)
    if not violations:
        return None  # a valid spec: nothing to find (estimate may still say the batch does not divide)
    cmd = rng.choice((["estimate"], ["plan", "--time-limit", "2"]))
    return _case("cluster spec", f"--cluster {spec[:40]!r}", [*cmd, "--model", "gpt-tiny", "--cluster", spec, *ESTIMATE],
                 {}, violations)


def file_case(kind: str, seeds: dict[str, dict], rng: random.Random) -> dict:
    """A cluster file or calibrated profile, mutated; used as --cluster FILE.json."""
    name = rng.choice(sorted(seeds))
    seed = seeds[name]
    if rng.random() < 0.05:
        content, what = special_file(rng)
        raw, violations = content, ["not a regular JSON file"]
    else:
        data, raw, what = mutate_json(seed, rng, strings=rng.random() < 0.3)
        parsed, reason = strict_json(raw)
        if reason:
            violations = [reason]
        else:
            violations = file_numbers_violations(parsed) + type_changes(seed, parsed)
            violations += [f"{'.'.join(map(str, p))} was positive" for p in _leaf_paths(seed, (int, float))
                           if _get(seed, p) > 0 and _lookup(parsed, p) is not None and _lookup(parsed, p) <= 0]
            violations = violations or None
    return _case(kind, f"{name}: {what}", ["estimate", "--model", "gpt-tiny", "--cluster", "c.json", *ESTIMATE,
                                           "--dp", "1"],
                 {"c.json": raw}, violations)


def _lookup(data: Any, path: tuple) -> Any:
    try:
        v = _get(data, path)
    except (KeyError, IndexError, TypeError):
        return None
    return v if type(v) in (int, float) else None


# flag -> (subcommands, least valid, most valid or None for a float in (0, 86400])
FLAGS = {"--tp": (("plan", "estimate"), 1, 10**7), "--pp": (("plan", "estimate"), 1, 10**7),
         "--dp": (("plan", "estimate"), 1, 10**7), "--cp": (("plan", "estimate"), 1, 10**7),
         "--ep": (("plan", "estimate"), 1, 10**7), "--vp": (("plan", "estimate"), 1, 10**5),
         "--micro-batch": (("plan", "estimate"), 1, 2**40), "--num-microbatches": (("plan",), 1, 2**40),
         "--zero-group": (("estimate",), 0, 10**7), "--global-batch": (("plan", "estimate"), 1, 2**40),
         "--seq-len": (("plan", "estimate"), 1, 2**24), "--top": (("plan",), 1, 100),
         "--time-limit": (("plan",), 0, None), "--first-stage-layers": (("estimate",), 0, 10**5),
         "--last-stage-layers": (("estimate",), 0, 10**5), "--nproc": (("run",), 1, 10**7),
         "--steps": (("run",), 1, 10**9), "--seed": (("run",), 0, 2**64 - 1), "--max-restarts": (("run",), 0, 1000),
         "--checkpoint-every": (("run",), 0, 10**9), "--pg-timeout": (("run",), 0, 7 * 86400.0)}
BASE = {"plan": ["plan", "--model", "gpt-tiny", "--cluster", "cpu:1x4", "--time-limit", "2", *ESTIMATE],
        "estimate": ["estimate", "--model", "gpt-tiny", "--cluster", "cpu:1x4", *ESTIMATE],
        "run": ["run", "plan.json", "--nproc", "1", "--steps", "1"], "emit": ["emit", "plan.json", "-o", "out.py"]}


def flag_ok(flag: str, text: str) -> bool:
    """Whether ``text`` is a valid value of ``flag`` (argparse's int()/float() and the documented range)."""
    _, least, most = FLAGS[flag]
    try:
        value = float(text) if most is None or isinstance(most, float) else int(text)
    except ValueError:
        return False
    if most is None or isinstance(most, float):
        return 0 < value <= (most or 86400)  # NaN fails
    return least <= value <= most


def cli_case(single_plan: bytes, rng: random.Random) -> dict:
    cmd = rng.choice(("plan", "estimate", "run", "emit"))
    argv = list(BASE[cmd])
    files = {"plan.json": single_plan} if cmd in ("run", "emit") else {}
    if cmd == "emit":
        extra = rng.choice((["--bogus"], ["-o", ""], ["-o", "/"], ["-o", "/proc/x.py"], ["-o", "dir/"], ["-o", "a\nb.py"],
                            ["-o", "-"], ["-o", "\u2028.py"], ["-o", ".py"], ["-o", "import.py"], ["-o", "x" * 300 + ".py"],
                            ["--fuse", "--no-fuse"]))
        bad = extra[-1] in ("", "/", "/proc/x.py", "--bogus", "x" * 300 + ".py")
        return _case("cli", f"emit {' '.join(extra)[:40]!r}", argv + extra, files, ["bad output"] if bad else None,
                     emit=not bad, out=extra[-1] if extra[0] == "-o" else "out.py")
    names = [f for f, (cmds, _, _) in FLAGS.items() if cmd in cmds]
    picked = rng.sample(names, k=min(len(names), rng.choice((1, 1, 2))))
    violations = []
    for flag in picked:
        value = rng.choice(ODD_FLAG_VALUES)
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        if not flag_ok(flag, value):
            violations.append(f"{flag} {value[:20]!r}")
    if not violations:
        return None  # every value happened to be valid
    return _case("cli", " ".join(a[:20] for a in argv[len(BASE[cmd]):])[:60], argv, files, violations)


def _case(kind: str, what: str, argv: list[str], files: dict, violations: list[str] | None, *, emit: bool = False,
          out: str = "out.py") -> dict:
    return {"kind": kind, "what": what, "argv": argv, "files": files, "violations": violations, "emit": emit,
            "out": out}
