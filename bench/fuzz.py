"""Fuzz meshplan's inputs (issue 15): plan files, model configs, cluster specs, cluster files, calibrated
profiles and command lines, damaged the way a careless user, a shared file or a failing disk would.

    python bench/fuzz.py --cases 2000          # the full bench (about half an hour on 2 cores)
    python bench/fuzz.py --cases 200           # a quick look

Each case runs ``meshplan`` in its own process (forked from a warm worker that has imported meshplan and
torch, so that a case costs its work, not 4 s of imports), in a fresh directory, with a limit of 20 s of
CPU time, and of 20 s times the load average per core of waiting (a read from a FIFO uses no CPU). A
pool of 2 workers keeps within 2 cores. Counted per kind:

* **tracebacks**: the command's stderr holds "Traceback" (meshplan must exit 2 with one line);
* **hangs**: the command ran past either limit (killed with its process group);
* **invalid accepted**: meshplan exited 0 although ``fuzz_oracle`` finds a violation (checked
  independently of meshplan's validation), or an emitted script does not compile, or its module code
  or (one-process plans) one training step fails;
* **code executed**: the marker file a payload creates (``PWNED``) exists after the case, the
  emitted script's run included.

"valid refused" is shown for information: inputs the oracle finds fine that meshplan refuses with a
message (often rightly: the oracle does not know every rule). Reproducers of every finding are kept
under ``--keep`` (the case's files and its command line).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fuzz_cases import (MARKER, cli_case, cluster_spec_case, config_case, file_case,  # noqa: E402
                        plan_case)

REPO = HERE.parent
SEED_PLANS = {  # name -> `meshplan plan` flags (cpu clusters, tiny zoo models: emitted scripts can run)
    "gpt-dp4": ["--model", "gpt-tiny", "--cluster", "cpu:1x4", "--global-batch", "8", "--seq-len", "32"],
    "llama-tp2": ["--model", "llama-tiny", "--cluster", "cpu:1x4", "--global-batch", "4", "--seq-len", "32",
                  "--tp", "2", "--sp"],
    "gpt-pp2": ["--model", "gpt-tiny", "--cluster", "cpu:1x4", "--global-batch", "8", "--seq-len", "32", "--pp", "2"],
    "moe-ep2": ["--model", "moe-tiny", "--cluster", "cpu:1x4", "--global-batch", "8", "--seq-len", "32", "--ep", "2"],
    "gpt-1": ["--model", "gpt-tiny", "--cluster", "cpu:1x1", "--global-batch", "2", "--seq-len", "16"],
    "llama-1": ["--model", "llama-tiny", "--cluster", "cpu:1x1", "--global-batch", "2", "--seq-len", "16"],
}
KINDS = ("plan", "config", "cluster spec", "cluster file", "profile", "cli")
COLUMNS = ("tracebacks", "hangs", "invalid accepted", "code executed")
MEMORY_LIMIT_BYTES = 10 * 2**30  # per case: a runaway read is a finding, not a dead machine


# ---- seeds ---------------------------------------------------------------------------------------
def seed_plans(where: Path) -> dict[str, dict]:
    """Valid plans from the solver, cached in ``where`` (two at a time)."""
    where.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    todo = [n for n in SEED_PLANS if not (where / f"{n}.json").exists()]
    for i in range(0, len(todo), 2):
        procs = [subprocess.Popen([sys.executable, "-m", "meshplan.cli", "plan", *SEED_PLANS[n], "--time-limit", "5",
                                   "-q", "-o", str(where / f"{n}.json")], env=env, stdout=subprocess.DEVNULL)
                 for n in todo[i:i + 2]]
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"fuzz: could not plan a seed ({' '.join(p.args)})")
    return {n: json.loads((where / f"{n}.json").read_text()) for n in SEED_PLANS}


def cluster_file_seeds() -> dict[str, dict]:
    files = [*(REPO / "examples" / "clusters").glob("*.json"), REPO / "cost_model" / "presets" / "cpu.json"]
    return {f.stem: json.loads(f.read_text()) for f in files}


def profile_seeds() -> dict[str, dict]:
    """A calibrated profile as ``meshplan calibrate`` writes it (tests/cost_model/test_profile_cluster.py's
    synthetic one: timings made from known peaks)."""
    matmul = [{"m": m, "n": n, "k": k, "seconds": 2 * m * n * k / 20e9 + 3e-6}
              for m, n, k in ((128, 128, 128), (512, 512, 512), (1024, 768, 256))]
    collectives = {kind: [{"group_size": size, "bytes": b, "seconds": 5e-4 + b / 1e9} for size in (2, 4)
                          for b in (16 << 10, 256 << 10, 4 << 20)] for kind in ("all-reduce", "all-gather")}
    return {"synthetic": {
        "schema": "meshplan.profile/1", "machine": {"kind": "cpu/x86_64/Test CPU/2 cores", "cores": 2,
                                                    "memory_bytes": 24e9},
        "processes": 4, "threads_per_process": 1, "dtype": "float32", "matmul": matmul,
        "memory_copy": [{"bytes": 2 << 26, "seconds": (2 << 26) / 8e9}], "small_op_s": 3e-6,
        "attention": {"batch_heads": 4, "seq_len": 256, "head_dim": 64, "seconds": 0.01},
        "process_rss_bytes": 4.5e8, "collectives": collectives}}


class Shapes:
    """name -> shape of the parameters of the zoo model a plan names (built on meta, cached); None
    where the plan's model is not a small zoo model the oracle can build."""

    def __init__(self) -> None:
        self.cache: dict[str, Any] = {}

    def __call__(self, plan: Any) -> dict[str, tuple[int, ...]] | None:
        cfg = plan.get("model") if isinstance(plan, dict) else None
        source = plan.get("source") if isinstance(plan, dict) else None
        if not isinstance(cfg, dict) or (isinstance(source, dict) and source.get("kind") not in (None, "zoo")):
            return None
        small = all(type(cfg.get(k)) is int and 0 < cfg[k] <= limit
                    for k, limit in (("layers", 16), ("hidden", 4096), ("vocab", 2**17), ("heads", 64)))
        if not small:
            return None
        key = json.dumps(cfg, sort_keys=True)
        if key not in self.cache:
            import torch

            from meshplan import zoo

            try:
                with torch.device("meta"):
                    model = zoo.build_from_config(cfg)
                self.cache[key] = {n: tuple(p.shape) for n, p in model.named_parameters()}
            except Exception:  # noqa: BLE001 - the oracle then cannot check the layouts
                self.cache[key] = None
        return self.cache[key]


def make_cases(n: int, seed: int, seeds: dict[str, dict]) -> list[dict]:
    rng = random.Random(seed)
    shapes, clusters, profiles = Shapes(), cluster_file_seeds(), profile_seeds()
    single = json.dumps(seeds["gpt-1"]).encode()
    weights = {"plan": 0.40, "config": 0.12, "cluster spec": 0.10, "cluster file": 0.10, "profile": 0.08, "cli": 0.20}
    makers: dict[str, Callable[[], dict | None]] = {
        "plan": lambda: plan_case(seeds, shapes, rng), "config": lambda: config_case(rng),
        "cluster spec": lambda: cluster_spec_case(rng), "cluster file": lambda: file_case("cluster file", clusters, rng),
        "profile": lambda: file_case("profile", profiles, rng), "cli": lambda: cli_case(single, rng)}
    cases: list[dict] = []
    while len(cases) < n:
        kind = rng.choices(list(weights), weights=list(weights.values()))[0]
        case = makers[kind]()
        if case is not None:
            case["id"] = len(cases)
            cases.append(case)
    return cases


# ---- running one case (in a pool worker) -----------------------------------------------------------
def _warm() -> None:
    """Import once per worker what every case needs, and trace a tiny model once (torch.export's first
    call costs seconds); cases are forked from here."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import contextlib
    import io

    import torch  # noqa: F401

    import meshplan.api  # noqa: F401
    import meshplan.cli
    import meshplan.codegen  # noqa: F401

    with contextlib.suppress(ImportError):  # the Hugging Face config cases
        import transformers  # noqa: F401

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        meshplan.cli.main(["estimate", "--model", "gpt-tiny", "--cluster", "cpu:1x4", "--global-batch", "8",
                           "--seq-len", "32"])


def load_factor() -> float:
    """How much longer than on an idle machine a case waits now: the load average per core, 1 to 16. Only
    the wall-clock limit (a case blocked on a FIFO uses no CPU) is scaled by it; the CPU-time limit is not."""
    return min(16.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def _materialize(where: Path, files: dict[str, Any]) -> None:
    for name, content in files.items():
        path = where / name
        if isinstance(content, (bytes, bytearray)):
            path.write_bytes(content)
        elif content[0] == "fifo":
            os.mkfifo(path)
        elif content[0] == "symlink":
            path.symlink_to(content[1])
        elif content[0] == "dir":
            path.mkdir()
        elif content[0] == "sparse":
            with open(path, "wb") as f:
                f.truncate(content[1])


def _forked(where: Path, tag: str, fn: Callable[[], int | None], timeout_s: float,
            env: dict[str, str] | None = None) -> dict:
    """Run ``fn`` in a forked child (own session, cwd ``where``, stdout/stderr to files); its exit status,
    output and whether it hung: ran past ``timeout_s`` of CPU time (``RLIMIT_CPU``: the kernel stops it
    with SIGXCPU), or waited past ``timeout_s`` times the load (``load_factor``). CPU time is what a case
    costs on an idle machine; wall time on a shared one is mostly others' work."""
    out, err = where / f"{tag}.stdout", where / f"{tag}.stderr"
    wall_s = timeout_s * load_factor()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.setsid()
            os.chdir(where)
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
            cpu_s = math.ceil(timeout_s)  # SIGXCPU at the soft limit, SIGKILL at the hard one
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
            for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                new = os.open(path, flags, 0o644)
                os.dup2(new, fd)
                os.close(new)
            os.environ.update(env or {})
            try:
                result = fn()
                code = result if isinstance(result, int) else 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, (int, type(None))):
                    print(exc.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - what an uncaught exception would print
                traceback.print_exc()
                code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code & 0xFF if code >= 0 else 1)
    hung, status = "", 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > wall_s:
            hung = f"waited past {wall_s:.0f} s ({timeout_s:.0f} s x load {wall_s / timeout_s:.1f})"
            _kill_group(pid)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.02)
    _kill_group(pid)  # what the case left running (torchrun's workers)
    rc = os.waitstatus_to_exitcode(status)
    if rc in (-signal.SIGXCPU, -signal.SIGKILL) and not hung:
        hung = f"ran past {timeout_s:.0f} s of CPU time"
    read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
    return {"rc": rc, "hung": hung, "stdout": read(out), "stderr": read(err), "wall_s": time.monotonic() - start}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(argv: list[str]) -> Callable[[], int]:
    def call() -> int:
        from meshplan.cli import main

        sys.argv = ["meshplan", *argv]
        return main(argv)
    return call


def _script(path: Path, run_name: str, argv: list[str]) -> Callable[[], None]:
    def call() -> None:
        import runpy

        sys.path.insert(0, str(path.parent))
        sys.argv = [str(path), *argv]
        runpy.run_path(str(path), run_name=run_name)
    return call


def run_case(case: dict, root: str, timeout_s: float) -> dict:
    where = Path(tempfile.mkdtemp(prefix=f"case{case['id']}-", dir=root))
    _materialize(where, case["files"])
    first = _forked(where, "cli", _cli(case["argv"]), timeout_s)
    result = {"id": case["id"], "kind": case["kind"], "rc": first["rc"], "wall_s": first["wall_s"],
              "findings": [], "dir": str(where)}
    found = result["findings"]
    if first["hung"]:
        found.append(("hangs", first["hung"]))
    elif "Traceback" in first["stderr"]:
        found.append(("tracebacks", _last_line(first["stderr"])))
    accepted = first["rc"] == 0 and not first["hung"]
    if accepted and case["violations"]:
        found.append(("invalid accepted", "; ".join(case["violations"])[:300]))
    if accepted and case["emit"]:  # also where invalid: does the script it wrote run a payload?
        found += [f for f in _check_script(where, case, timeout_s) if not case["violations"]]
    elif not accepted and not first["hung"] and case["violations"] == [] and case["kind"] == "plan":
        result["valid_refused"] = _last_line(first["stderr"])
    if (where / MARKER).exists():
        found.append(("code executed", f"{MARKER} created"))
    result["refused"] = not accepted
    if not found:
        shutil.rmtree(where, ignore_errors=True)
    return result


def _check_script(where: Path, case: dict, timeout_s: float) -> list[tuple[str, str]]:
    """An accepted emit: the script (and its kernels module) compiles, its module code runs, and a
    one-process plan trains one step."""
    script = where / case["out"]
    if not script.is_file():
        return [("invalid accepted", f"emit exited 0 but wrote no {case['out']}")]
    for path in [script, *where.glob("*_kernels.py")]:
        try:
            compile(path.read_bytes(), str(path), "exec")
        except (SyntaxError, ValueError) as exc:
            return [("invalid accepted", f"{path.name} does not compile: {exc}")]
    plan = json.loads((where / "plan.json").read_text())
    if (plan.get("source") or {}).get("kind") == "builder":
        return []  # the script imports the user's package, which may live on the machine that runs it
    module = _forked(where, "module", _script(script, "emitted", []), timeout_s)
    if module["hung"] or module["rc"] != 0:
        return [("invalid accepted", f"the script's module code fails: {_last_line(module['stderr'])}")]
    mesh = plan["mesh"]
    if mesh.get("pp", 1) * mesh.get("dp", 1) * mesh.get("cp", 1) * mesh.get("tp", 1) == 1:
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(_free_port()), "TRITON_INTERPRET": "1"}
        step = _forked(where, "step", _script(script, "__main__", ["--steps", "1"]), timeout_s, env)
        if step["hung"] or step["rc"] != 0 or "loss" not in step["stdout"]:
            return [("invalid accepted", f"one training step fails: rc {step['rc']}, hung {step['hung']}, "
                                         f"{_last_line(step['stderr'])}")]
    return []


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# ---- the bench -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per case")
    p.add_argument("--budget", type=float, default=None,
                   help="stop after this many seconds and report the cases done (a shared machine may not finish)")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of " + ", ".join(KINDS))
    p.add_argument("--seeds-dir", default=os.path.join(tempfile.gettempdir(), "meshplan-fuzz-seeds"))
    p.add_argument("--keep", default=os.path.join(tempfile.gettempdir(), "meshplan-fuzz-findings"),
                   help="reproducers of the findings go here")
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    start = time.monotonic()
    kinds = set(args.kinds.split(","))
    cases = [c for c in make_cases(args.cases * 3 if kinds != set(KINDS) else args.cases, args.seed,
                                   seed_plans(Path(args.seeds_dir))) if c["kind"] in kinds][:args.cases]
    keep = Path(args.keep)
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    results = []
    ctx = multiprocessing.get_context("forkserver")
    with cf.ProcessPoolExecutor(max_workers=args.workers, mp_context=ctx, initializer=_warm) as pool:
        futures = {pool.submit(run_case, c, str(keep), args.timeout): c for c in cases}
        for i, fut in enumerate(cf.as_completed(futures), 1):
            case = futures[fut]
            res = fut.result()
            res["case"] = case
            results.append(res)
            if res["findings"]:
                (Path(res["dir"]) / "case.json").write_text(json.dumps(
                    {"kind": case["kind"], "what": case["what"], "argv": case["argv"],
                     "violations": case["violations"], "findings": res["findings"]}, indent=1))
            if i % 50 == 0:
                print(f"  {i}/{len(cases)} cases, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
            if args.budget is not None and time.monotonic() - start > args.budget:
                print(f"budget of {args.budget:.0f} s spent: {i} of {len(cases)} cases done", flush=True)
                pool.shutdown(wait=True, cancel_futures=True)
                break
    _report(results, time.monotonic() - start, keep)
    return 1 if any(r["findings"] for r in results) else 0


def _report(results: list[dict], wall_s: float, keep: Path) -> None:
    rows: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        row = rows[r["kind"]]
        row["cases"] += 1
        row["refused"] += r["refused"]
        row["valid refused"] += "valid_refused" in r
        for column in {c for c, _ in r["findings"]}:
            row[column] += 1
    head = ("kind", "cases", "refused", *COLUMNS, "valid refused")
    print(f"{head[0]:<14}" + "".join(f"{h:>18}" for h in head[1:]))
    total = Counter()
    for kind in KINDS:
        if kind in rows:
            total.update(rows[kind])
            print(f"{kind:<14}" + "".join(f"{rows[kind][h]:>18}" for h in head[1:]))
    print(f"{'total':<14}" + "".join(f"{total[h]:>18}" for h in head[1:]))
    print(f"\n{len(results)} cases in {wall_s:.0f} s")
    findings = [(r, c, why) for r in results for c, why in r["findings"]]
    if findings:
        print(f"\nfindings (reproducers in {keep}):")
        for r, column, why in sorted(findings, key=lambda f: (f[1], f[0]["kind"]))[:60]:
            print(f"- [{column}] {r['kind']}: {r['case']['what'][:70]!r} -> {why[:200]}\n    {Path(r['dir']).name}: "
                  f"meshplan {' '.join(a[:40] for a in r['case']['argv'])[:160]}")
    refused = [r for r in results if "valid_refused" in r]
    if refused:
        print("\nvalid by the oracle but refused (information):")
        for r in refused[:15]:
            print(f"- {r['case']['what'][:70]!r}: {r['valid_refused'][:200]}")


if __name__ == "__main__":
    sys.exit(main())
