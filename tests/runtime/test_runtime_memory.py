"""runtime.memory: the measurement that checks the cost model's memory prediction (bench/cpu_memory.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from meshplan import zoo
from meshplan.runtime.memory import measure_plan_memory, resident_bytes, step_allocated_peak


def test_in_step_peak_is_the_most_held_at_once() -> None:
    def work() -> None:
        a = torch.empty(2**18)  # 1 MiB of float32
        b = torch.empty(2**19)  # 2 MiB: 3 MiB held
        del a
        c = torch.empty(2**17)  # 0.5 MiB: 2.5 MiB held
        del b, c

    peak = step_allocated_peak(work)
    assert 3 * 2**20 <= peak < 3 * 2**20 + 64 * 2**10


def test_resident_bytes_are_parameters_and_adam_state_counted_once() -> None:
    model = zoo.build("gpt-tiny")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    assert resident_bytes(model, opt) == 4 * n  # float32 weights, no state before the first step
    model(torch.randint(0, 64, (2, 8))).float().mean().backward()
    opt.step()
    # + the gradients, + exp_avg and exp_avg_sq (4 bytes each per element), + one step counter per tensor
    step_bytes = sum(opt.state[p]["step"].untyped_storage().nbytes() for p in params)
    assert resident_bytes(model, opt) == 4 * n + 4 * n + 8 * n + step_bytes
    opt.zero_grad()
    assert resident_bytes(model, opt) == 4 * n + 8 * n + step_bytes



def _event(ts: float, addr: int, nbytes: int) -> dict:
    return {"ts": ts, "args": {"Addr": addr, "Bytes": nbytes}}


def test_a_free_the_profiler_did_not_see_ends_with_its_collective_or_the_reuse_of_its_address() -> None:
    from meshplan.runtime.memory import _live_bytes

    # a reduce-scatter from t=10 to t=20 (gloo copies its input: block 0x1, whose last reference gloo's
    # worker thread drops, unrecorded); a block whose address is handed out again at t=40 (0x2); a
    # block that really stays (0x3); one freed in plain sight (0x4)
    ops = [{"name": "c10d::_reduce_scatter_base_", "ts": 10, "dur": 10}, {"name": "aten::mm", "ts": 25, "dur": 5}]
    memory = [_event(1, 0x3, 100), _event(12, 0x1, 1000), _event(26, 0x2, 10), _event(27, 0x4, 5),
              _event(28, 0x4, -5), _event(40, 0x2, 20), _event(50, 0x2, -20)]
    series = dict(_live_bytes(memory, ops))
    assert series[12] == 1100  # the copy is live inside its collective
    assert series[20] == 100  # and gone when the collective returns
    assert series[28] == 110  # 0x4 freed as recorded
    assert series[40] == 120  # 0x2's first block ends when its address is reused by the second
    assert series[50] == 100  # only the block that stays
    assert _live_bytes(memory)[-1] == (50, 1100)  # with no op record the copy is counted live to the end


_THREAD_FREE = """
import json, threading, torch
from meshplan.runtime.memory import measure_plan_memory

def setup():
    held = [torch.ones(2**24)]  # 64 MiB: above glibc's largest mmap threshold (32 MiB), so its own mapping
    worker = threading.Thread(target=held.clear)  # the last reference dropped on a thread the profiler does not follow
    worker.start()
    worker.join()
    return [torch.ones(2**18)]  # 1 MiB that stays

def step(state):
    torch.ones(2**19).sum()  # 2 MiB for a moment

print(json.dumps(measure_plan_memory(setup, step)))
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps (Linux)")
def test_a_block_another_thread_freed_is_not_counted_once_the_system_shows_it_unmapped() -> None:
    # A fresh process: glibc serves even a 64 MiB request from free space in the heap before it
    # considers mmap, and a heap that earlier tests in this process grew keeps the freed block mapped
    # (CI of stop 25: 65 MiB resident), where the rule rightly does not end it.
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _THREAD_FREE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["resident"] < 2 * 2**20, got  # the 64 MiB block's free was never recorded, yet it is not counted
    assert 3 * 2**20 <= got["peak"] < 4 * 2**20, got
    memory_events = [{"ts": 1, "args": {"Addr": 0x10, "Bytes": 2**26}}]
    from meshplan.runtime.memory import _live_bytes
    assert _live_bytes(memory_events, [], (5, [(0x0, 0x1000)]))[-1] == (1, 2**26)  # still mapped: counted live


MODEL = dict(family="gpt", layers=4, hidden=256, heads=8, vocab=4096, max_seq_len=128, name="gpt-mem")
# (name, mesh, zero, sp, micro-batch, schedule, recompute): DDP with full recompute, ZeRO-3, a 1F1B
# pipeline beside DP. On some runs gloo frees a start-up buffer only during or after the measured
# step on one rank: DDP's broadcast of the parameters (a concatenated copy, 21 MB here,
# ``_broadcast_coalesced`` in ``_sync_module_states``), and under TP + SP x DP something of the same
# kind moved a measurement from 136 to 185 MB against 195 predicted. Plans whose margin is smaller
# than that noise (plain DDP, ZeRO-1, TP x DP) are left to bench/cpu_memory.py, which shows them all.
CASES = (("ddp_full", dict(dp=4), 0, False, 4, "1f1b", "full"), ("zero3", dict(dp=4), 3, False, 4, "1f1b", "none"),
         ("pp2_dp2", dict(pp=2, dp=2), 0, False, 2, "1f1b", "none"))


def test_predicted_peak_memory_is_never_below_what_the_runtime_holds(tmp_path_factory) -> None:
    from meshplan import ir
    from meshplan.cost_model import Cluster, estimate
    from meshplan.frontend import trace

    from parity_support import launch
    plans = {}
    for name, mesh, zero, sp, mb, schedule, recompute in CASES:
        m = ir.Mesh(**mesh)
        plans[name] = ir.Plan(model=MODEL, cluster="cpu:1x4", global_batch=16, seq_len=128, mesh=m, zero_stage=zero,
                              sequence_parallel=sp, micro_batch_size=mb, num_microbatches=16 // (mb * m.dp),
                              schedule=schedule, recompute=(recompute,) * 4, stages=((0, 2), (2, 4)) if m.pp > 1 else (),
                              dtype="float32")
    ranks = launch(tmp_path_factory, 4, "memory_cases:measure", {n: p.to_dict() for n, p in plans.items()})
    graph, cluster = trace(zoo.build_from_config(MODEL), batch=1, seq_len=64), Cluster.preset("cpu", gpus_per_node=4)
    for name, plan in plans.items():
        measured = max(r[name]["peak"] for r in ranks)
        predicted = estimate(graph, cluster, plan).peak_memory_bytes
        assert measured > 30e6, (name, measured)  # the measurement sees the model (weights + Adam: 21 + 42 MB / shards)
        print(f"{name}: predicted {predicted / 1e6:.1f} MB, measured {measured / 1e6:.1f} MB")
        assert predicted >= measured, f"{name}: predicted {predicted / 1e6:.1f} MB < measured {measured / 1e6:.1f} MB"


FRAGMENT = """
import sys
import os
import torch
from meshplan.runtime.memory import return_freed_memory
if sys.argv[1] == "fixed":
    return_freed_memory()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # resident pages
del_me = torch.ones(24 * 2**20, dtype=torch.uint8)  # mmapped; its free raises glibc's threshold (to 32 MiB at most)
del del_me
before = rss()
big, small = [], []
for _ in range(20):
    big.append(torch.ones(4 * 2**20, dtype=torch.uint8))  # 4 MiB, written
    small.append(torch.ones(256, dtype=torch.uint8))  # still alive: pins the heap behind each big block
del big
print((rss() - before) / 2**20)
"""


def test_freed_tensors_leave_the_resident_set(tmp_path) -> None:
    """80 MiB of 4 MiB tensors, freed while small tensors allocated between them live on: glibc's
    raised mmap threshold (a freed 24 MiB block raises it to 24 MiB) had put them on the heap, which
    keeps a share of them (32 MiB here); after return_freed_memory they all go back to the system."""
    import subprocess
    import sys

    def held_mib(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", FRAGMENT, mode], capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])

    assert held_mib("fixed") < 4
    default = held_mib("default")  # the failure the fix is for: it depends on glibc's state in this process
    if default <= 16:  # seen in one CI run under load: the allocator returned the blocks by itself
        pytest.skip(f"without the fix this allocator kept only {default:.0f} MiB: nothing to compare the fix with")


META_BUILD = """
import ctypes, sys
from meshplan.runtime.memory import return_freed_memory
from meshplan.runtime.materialize import build_on_meta
if sys.argv[1] == "fixed":
    return_freed_memory()


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                                              "fordblks keepcost".split()]


mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
before = mallinfo2().arena
config = {"family": "llama", "layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn_hidden": 4096,
          "vocab": 8192, "max_seq_len": 128}  # 136M parameters: 0.55 GB in fp32
build_on_meta({"kind": "zoo", "config": config}, 0)
if sys.argv[1] == "default":
    return_freed_memory()  # too late: the heap has grown
print((mallinfo2().arena - before) / 2**20)
"""


def test_the_meta_build_does_not_grow_the_heap_when_freed_memory_is_returned_first() -> None:
    """Building on meta allocates each full parameter and frees it; glibc served those from the heap
    (its mmap threshold raised by the first free) and the heap grew by about the model's fp32 size.
    glibc takes later requests from that free heap before it considers mmap, so a worker that set the
    threshold after the build kept its pages resident (issue 12's memory demo: 2.58 GB against 1.97 GB
    per rank). ``meshplan run``'s worker and emitted scripts call return_freed_memory before the build."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt and mallinfo2 are glibc's")

    def grown_mib(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", META_BUILD, mode], capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])

    assert grown_mib("fixed") < 32
    late = grown_mib("default")
    if late < 64:
        pytest.skip(f"without the fix this allocator grew the heap by {late:.0f} MiB only: nothing to compare")
