"""CPU profiles: compute timed as CPU time and scaled by the measured contention of ranks that share
the cores (cost_model.profile.contended), and the fused attention's rate by head dim
(Accelerator.attention_at). Known answers from synthetic profiles; GPU presets are untouched."""
from __future__ import annotations

import copy
import math

import pytest

from meshplan import ir
from meshplan.cost_model import Cluster, attention_fwd_bwd_s, cluster_from_profile, collective_time
from meshplan.cost_model.profile import contended, contention_factor

from test_profile_cluster import PEAK, OVERHEAD, synthetic_profile, with_backward_and_ops

CPU_PEAK = 100e9  # FLOP/s of one rank's thread, counted in CPU time
FACTOR = 2.5  # the wall time of all ranks' work over its CPU time


def with_cpu_times() -> dict:
    """A profile whose compute rows carry CPU times made from CPU_PEAK, and a contention of FACTOR; the
    wall times are noise (0.001 s each): only the CPU times and the contention may count."""
    data = with_backward_and_ops()
    for row in data["matmul"]:
        row["cpu_seconds"], row["seconds"] = 2 * row["m"] * row["n"] * row["k"] / CPU_PEAK + OVERHEAD / FACTOR, 1e-3
    data["small_op_cpu_s"] = OVERHEAD / FACTOR
    data["op_overhead"] = {**data["op_overhead"], "plain_cpu_s": 4e-6, "dtensor_cpu_s": 2e-5}
    data["contention"] = {"wall_s": 0.25, "cpu_s": 0.1}
    return data


def test_compute_timings_become_cpu_time_times_the_contention() -> None:
    data = with_cpu_times()
    assert contention_factor(data) == pytest.approx(FACTOR)
    out = contended(data)
    assert out["matmul"][0]["seconds"] == pytest.approx(data["matmul"][0]["cpu_seconds"] * FACTOR)
    assert out["small_op_s"] == pytest.approx(OVERHEAD)
    assert out["op_overhead"]["plain_s"] == pytest.approx(4e-6 * FACTOR)
    assert out["op_overhead"]["dtensor_s"] == pytest.approx(2e-5 * FACTOR)
    # rows without a CPU time and the collectives keep their wall times
    assert out["memory_copy"] == data["memory_copy"] and out["collectives"] == data["collectives"]
    accel = cluster_from_profile(data).accelerator
    assert accel.peak("float32") == pytest.approx(CPU_PEAK / FACTOR, rel=1e-6)
    assert accel.kernel_overhead_s == pytest.approx(OVERHEAD)
    assert accel.shared_by == 2.0  # ranks per core stays processes / cores (pipeline ranks lend theirs)


def test_profiles_without_contention_keep_their_wall_times() -> None:
    data = with_cpu_times()
    del data["contention"]
    assert contended(data) is data and contention_factor(data) == 1.0
    assert cluster_from_profile(data).accelerator.peak("float32") > 2 * CPU_PEAK  # fitted to the 1 ms wall times
    old = synthetic_profile()
    assert cluster_from_profile(old).accelerator.peak("float32") == pytest.approx(PEAK, rel=1e-6)


def test_contention_below_one_counts_as_one_and_bad_values_are_refused() -> None:
    data = with_cpu_times()
    data["contention"] = {"wall_s": 0.09, "cpu_s": 0.1}  # a rank timed alone: no slower than its CPU time
    assert contention_factor(data) == 1.0
    data["contention"] = {"wall_s": 0.0, "cpu_s": 0.1}
    with pytest.raises(ir.InvalidClusterError, match="contention: wall_s must be a positive number"):
        cluster_from_profile(data)


def attention_rows(effs: dict[int, tuple[float, float]], peak: float) -> list[dict]:
    """Rows of a profile whose SDPA at each head dim ran at efficiency eff with backward ratio r."""
    rows = []
    for head_dim, (eff, ratio) in effs.items():
        fwd = 0.5 * 4 * 4 * 256 ** 2 * head_dim / (eff * peak) + OVERHEAD
        rows.append({"batch_heads": 4, "seq_len": 256, "head_dim": head_dim, "fwd_s": fwd, "bwd_s": ratio * fwd})
    return rows


def test_attention_rate_is_interpolated_by_head_dim() -> None:
    data = synthetic_profile()
    data["attention_by_head_dim"] = attention_rows({32: (0.2, 2.0), 64: (0.4, 2.5), 128: (0.5, 3.0)}, PEAK)
    accel = cluster_from_profile(data).accelerator
    assert accel.attention_at(32) == pytest.approx((0.2, 2.0), rel=1e-6)
    assert accel.attention_at(64) == pytest.approx((0.4, 2.5), rel=1e-6)
    # halfway in log2 between 64 and 128
    assert accel.attention_at(64 * math.sqrt(2)) == pytest.approx((0.45, 2.75), rel=1e-6)
    assert accel.attention_at(16) == pytest.approx((0.2, 2.0), rel=1e-6)  # the nearest beyond the ends
    assert accel.attention_at(256) == pytest.approx((0.5, 3.0), rel=1e-6)
    flops = 4 * 8 * 128 * 128 * 32  # counted as full causal: half runs
    fwd, bwd = attention_fwd_bwd_s(accel, "float32", flops, head_dim=32)
    assert fwd == pytest.approx(flops / 2 / (0.2 * PEAK) + OVERHEAD, rel=1e-6) and bwd == pytest.approx(2 * fwd)
    # without a head dim (or a curve): the single efficiency and a backward of 2.5 forwards
    plain = cluster_from_profile(synthetic_profile()).accelerator
    assert plain.attention_by_head_dim == () and plain.attention_at(32) == (plain.attention_efficiency, 2.5)
    fwd, bwd = attention_fwd_bwd_s(plain, "float32", flops, head_dim=32)
    assert bwd == pytest.approx(2.5 * fwd)


def test_gpu_presets_have_no_attention_curve() -> None:
    accel = Cluster.preset("h100-sxm", nodes=1).accelerator
    assert accel.attention_by_head_dim == () and accel.attention_at(128) == (accel.attention_efficiency, 2.5)


def test_a_malformed_attention_curve_is_refused() -> None:
    data = synthetic_profile()
    data["attention_by_head_dim"] = attention_rows({32: (0.2, 2.0)}, PEAK)
    with pytest.raises(ir.InvalidClusterError, match="attention_by_head_dim must be a list of at least 2"):
        cluster_from_profile(data)


def test_median_profile_keeps_the_cpu_times_and_contention() -> None:
    from meshplan.runtime.calibrate import median_profile

    a = with_cpu_times()
    a["attention_by_head_dim"] = attention_rows({32: (0.2, 2.0), 64: (0.4, 2.5)}, PEAK)
    b, c = copy.deepcopy(a), copy.deepcopy(a)
    b["contention"] = {"wall_s": 0.3, "cpu_s": 0.1}
    c["contention"] = {"wall_s": 0.2, "cpu_s": 0.1}
    b["matmul"][0]["cpu_seconds"] *= 3
    merged = median_profile([a, b, c])
    assert merged["contention"] == {"wall_s": 0.25, "cpu_s": 0.1}
    assert merged["matmul"][0]["cpu_seconds"] == a["matmul"][0]["cpu_seconds"]
    assert merged["attention_by_head_dim"] == a["attention_by_head_dim"] and merged["rounds"] == 3
    assert collective_time("all-reduce", 1 << 20, 4, 1, cluster_from_profile(merged)) > 0


def test_collectives_with_cpu_times_are_scaled_too() -> None:
    data = with_cpu_times()
    for rows in data["collectives"].values():
        for row in rows:
            row["cpu_seconds"], row["seconds"] = row["seconds"] / FACTOR, 1.0  # wall times: noise
    data["sync_after_compute"] = {"group_size": 4, "bytes": 16 << 10, "compute_s": 9.0, "seconds": 9.0,
                                  "compute_cpu_s": 1e-3, "cpu_seconds": 1e-3 + 0.2e-3}
    cluster = cluster_from_profile(data)
    reference = cluster_from_profile(synthetic_profile())
    assert collective_time("all-reduce", 1 << 20, 4, 1, cluster) == pytest.approx(
        collective_time("all-reduce", 1 << 20, 4, 1, reference), rel=1e-6)
    alone = collective_time("all-reduce", 16 << 10, 4, 1, reference)
    assert cluster.accelerator.sync_overhead_s == pytest.approx(max(0.0, 0.2e-3 * FACTOR - alone), abs=1e-12)


def test_single_tensor_adamw_moves_80_bytes_per_parameter_on_cpu_ranks() -> None:
    from meshplan.cost_model.dispatch import ADAMW_ELEMENT_PASSES, single_tensor_adamw_excess_s

    assert ADAMW_ELEMENT_PASSES == 2 + 3 + 2 + 3 + 2 + 2 + 2 + 4  # the eight ops' reads and writes
    cpu = cluster_from_profile(synthetic_profile())
    bw = cpu.accelerator.memory_bw_Bps
    assert single_tensor_adamw_excess_s(cpu, 1e6, 36) == pytest.approx((80 - 36) * 1e6 / bw)
    assert single_tensor_adamw_excess_s(Cluster.preset("h100-sxm", nodes=1), 1e6, 36) == 0.0
