"""A cluster from a measured profile (cost_model.profile): the fits recover what the timings were
made from, and a malformed profile or one of another machine kind is refused with the reason."""
from __future__ import annotations

import copy
import json
import math

import pytest

from meshplan import ir
from meshplan.cost_model import Cluster, bus_bytes, cluster_from_profile, collective_time, matmul_time_s, parse_cluster

KIND = "cpu/x86_64/Test CPU/2 cores"
PEAK, OVERHEAD, COPY_BPS = 20e9, 3e-6, 8e9
# (kind, group size) -> (latency of one call, bus bandwidth)
TRUE = {("all-reduce", 2): (5e-4, 0.6e9), ("all-reduce", 4): (4e-3, 1.2e9), ("all-gather", 2): (3e-4, 0.4e9),
        ("all-gather", 4): (3e-3, 0.8e9)}


def synthetic_profile() -> dict:
    matmul = [{"m": m, "n": n, "k": k, "seconds": 2 * m * n * k / PEAK + OVERHEAD}
              for m, n, k in ((128, 128, 128), (512, 512, 512), (1024, 768, 256))]
    collectives: dict[str, list] = {}
    for (kind, size), (call_s, bus) in TRUE.items():
        for nbytes in (16 << 10, 256 << 10, 4 << 20):
            collectives.setdefault(kind, []).append(
                {"group_size": size, "bytes": nbytes, "seconds": call_s + bus_bytes(kind, nbytes, size) / bus})
    return {"schema": "meshplan.profile/1", "machine": {"kind": KIND, "cores": 2, "memory_bytes": 24e9},
            "processes": 4, "threads_per_process": 1, "dtype": "float32", "matmul": matmul,
            "memory_copy": [{"bytes": 2 << 26, "seconds": (2 << 26) / COPY_BPS}], "small_op_s": OVERHEAD,
            "attention": {"batch_heads": 4, "seq_len": 256, "head_dim": 64,
                          "seconds": 0.5 * 4 * 4 * 256 * 256 * 64 / (0.5 * PEAK) + OVERHEAD},
            "process_rss_bytes": 4.5e8, "collectives": collectives}


def test_fits_recover_the_numbers_the_timings_came_from() -> None:
    cluster = cluster_from_profile(synthetic_profile())
    accel = cluster.accelerator
    assert cluster.world_size == 4 and cluster.nodes == 1
    assert accel.peak("float32") == pytest.approx(PEAK, rel=1e-6) and accel.matmul_efficiency["float32"] == 1.0
    assert accel.memory_bw_Bps == pytest.approx(COPY_BPS) and accel.kernel_overhead_s == OVERHEAD
    assert accel.attention_efficiency == pytest.approx(0.5, rel=1e-3)
    assert accel.memory_bytes == pytest.approx(6e9) and accel.reserved_bytes == pytest.approx(4.5e8)
    assert matmul_time_s(accel, "float32", 512, 512, 512, 4) == pytest.approx(2 * 512 ** 3 / PEAK + OVERHEAD, rel=1e-4)
    for (kind, size), (call_s, bus) in TRUE.items():
        for nbytes in (1 << 20, 64 << 20):
            expect = call_s + bus_bytes(kind, nbytes, size) / bus
            assert collective_time(kind, nbytes, size, 1, cluster) == pytest.approx(expect, rel=1e-6)


def test_unmeasured_collectives_and_sizes_fall_back_sensibly() -> None:
    cluster = cluster_from_profile(synthetic_profile())
    tier = cluster.tiers[0]
    assert tier.measured and tier.achievable_Bps == tier.bandwidth_Bps == pytest.approx(1.2e9)
    # reduce-scatter was not measured: the tier's all-reduce numbers, per step
    assert collective_time("reduce-scatter", 1 << 20, 4, 1, cluster) > 0
    # a group of 3 takes the nearest measured size (4), latency scaled by the tree depth
    assert tier.latency_of("all-reduce", 3) == pytest.approx(4e-3 * math.ceil(math.log2(3)) / 2)


def test_parse_cluster_takes_a_profile_path(tmp_path) -> None:
    path = tmp_path / "here.json"
    path.write_text(json.dumps(synthetic_profile()))
    cluster = parse_cluster(str(path))
    assert cluster.spec == str(path) and cluster.world_size == 4
    assert Cluster.from_profile(str(path), expect_kind=KIND).accelerator == cluster.accelerator


def _broken(change) -> dict:
    data = copy.deepcopy(synthetic_profile())
    change(data)
    return data


BWD_PEAK, PLAIN_OP, DTENSOR_OP = 0.8 * PEAK, 12e-6, 90e-6
PLAIN_DISPATCHES, DTENSOR_DISPATCHES = 6.0, 7.5  # aten ops one chain op dispatches (calibrate counts them)
GELU_NS = 2.0  # seconds per element of GELU (tanh), in ns
FAULT_S = 0.03  # faulting in 64 MiB of fresh pages


def with_backward_and_ops() -> dict:
    """The optional fields: both gradient matmuls of each shape at 0.8 of the forward's peak, one
    autograd op plain and as a DTensor op with the ops it dispatches, the transcendental ops."""
    data = synthetic_profile()
    data["matmul_backward"] = [{**r, "seconds": 2 * 2 * r["m"] * r["n"] * r["k"] / BWD_PEAK + 2 * OVERHEAD}
                               for r in data["matmul"]]
    data["op_overhead"] = {"plain_s": PLAIN_OP, "dtensor_s": DTENSOR_OP, "plain_dispatches": PLAIN_DISPATCHES,
                           "dtensor_dispatches": DTENSOR_DISPATCHES}
    data["transcendental"] = [{"op": op, "elements": 1 << 21, "seconds": (1 << 21) * GELU_NS * 1e-9 * (i + 1)}
                              for i, op in enumerate(("gelu", "gelu_backward", "log_softmax", "log_softmax_backward"))]
    data["first_touch"] = {"bytes": 64 << 20, "fresh_s": 0.002 + FAULT_S, "reuse_s": 0.002}
    return data


def test_optional_backward_and_per_op_fields_are_fitted() -> None:
    from meshplan.cost_model.kernels import matmul_fwd_bwd_s

    old = cluster_from_profile(synthetic_profile()).accelerator  # profiles without them still load
    assert old.matmul_bwd_efficiency == 1.0 and old.dispatch_s == old.dtensor_dispatch_s == 0.0
    assert old.transcendental_s_per_elem == () and old.transcendental_s("gelu", 100) is None
    accel = cluster_from_profile(with_backward_and_ops()).accelerator
    assert accel.matmul_bwd_efficiency == pytest.approx(0.8, rel=1e-6)
    assert accel.dispatch_s == pytest.approx(PLAIN_OP / PLAIN_DISPATCHES)
    assert accel.dtensor_dispatch_s == pytest.approx(DTENSOR_OP / DTENSOR_DISPATCHES)
    assert accel.transcendental_s("gelu", 1000) == pytest.approx(1000 * GELU_NS * 1e-9)
    assert accel.transcendental_s("log_softmax_backward", 1000) == pytest.approx(4000 * GELU_NS * 1e-9)
    assert old.first_touch_s_per_byte == 0.0 and accel.first_touch_s_per_byte == pytest.approx(FAULT_S / (64 << 20))
    assert accel.peak("float32") == pytest.approx(PEAK, rel=1e-6)  # the forward fit is untouched
    fwd, bwd = matmul_fwd_bwd_s(accel, "float32", 512, 512, 512, 4)
    assert bwd == pytest.approx(2 * fwd / 0.8, rel=1e-6)


def test_profiles_without_dispatch_counts_take_the_chain_structure() -> None:
    from meshplan.cost_model.profile import CHAIN_DISPATCHES

    data = with_backward_and_ops()
    data["op_overhead"] = {"plain_s": PLAIN_OP, "dtensor_s": DTENSOR_OP}  # written before the counts
    accel = cluster_from_profile(data).accelerator
    assert accel.dispatch_s == pytest.approx(PLAIN_OP / CHAIN_DISPATCHES)
    assert accel.dtensor_dispatch_s == pytest.approx(DTENSOR_OP / CHAIN_DISPATCHES)


def test_dispatches_are_charged_per_op_the_layer_runs(make_graph, make_gpt) -> None:
    import dataclasses

    from meshplan.cost_model.dispatch import layer_dispatches
    from meshplan.cost_model.layer_cost import LayerShape, layer_cost

    dims = make_graph(make_gpt(4, 256, 8)).dims
    base = cluster_from_profile(synthetic_profile())
    ops_only = dataclasses.replace(base, accelerator=dataclasses.replace(
        base.accelerator, dispatch_s=PLAIN_OP, dtensor_dispatch_s=DTENSOR_OP))
    for tp, sp in ((1, False), (4, False), (4, True)):
        shape = LayerShape(dims=dims, micro_batch=4, seq_len=128, tp=tp, sp=sp, dtype="float32")
        ops = layer_dispatches(dims, tp, sp)
        assert (ops.dtensor_fwd == 0) == (tp == 1) and ops.plain_fwd > 0
        a, b = layer_cost(shape, base), layer_cost(shape, ops_only)
        assert b.fwd_compute_s - a.fwd_compute_s == pytest.approx(
            ops.plain_fwd * PLAIN_OP + ops.dtensor_fwd * DTENSOR_OP, rel=1e-9)
        assert b.bwd_compute_s - a.bwd_compute_s == pytest.approx(
            ops.plain_bwd * PLAIN_OP + ops.dtensor_bwd * DTENSOR_OP, rel=1e-9)


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(schema="meshplan.cluster/1"), "schema 'meshplan.cluster/1', expected 'meshplan.profile/1'"),
    (lambda d: d.pop("matmul"), "matmul must be a list of at least 2 measurements, got None"),
    (lambda d: d["matmul"][1].update(seconds=-1.0), "matmul[1]: seconds must be a positive number, got -1.0"),
    (lambda d: d["machine"].update(kind=""), "machine.kind is empty"),
    (lambda d: d.update(processes=0), "processes must be a positive integer, got 0"),
    (lambda d: d["collectives"].pop("all-reduce"), "collectives lacks 'all-reduce'"),
    (lambda d: d["collectives"].update(gossip=[]), "unknown kind 'gossip'"),
    (lambda d: d["collectives"]["all-gather"][0].update(group_size=8), "a group must have 2 to processes(4) ranks"),
    (lambda d: d.update(dtype="int4"), "dtype 'int4' is not one of"),
    (lambda d: d.update(process_rss_bytes=7e9), "process_rss_bytes (7e+09) is not below the memory per process"),
    (lambda d: d.update(matmul_backward=[]), "matmul_backward must be a list of at least 2 measurements"),
    (lambda d: d.update(op_overhead={"plain_s": 1e-5}), "op_overhead: dtensor_s must be a positive number"),
    (lambda d: d.update(op_overhead=3), "op_overhead must be an object"),
    (lambda d: d.update(transcendental=[{"op": "exp", "elements": 8, "seconds": 1e-6}]),
     "transcendental[0]: op must be one of"),
    (lambda d: d.update(transcendental=[{"op": "gelu", "elements": 0, "seconds": 1e-6}]),
     "transcendental[0]: elements must be a positive number, got 0"),
    (lambda d: d.update(transcendental={}), "transcendental must be a non-empty list"),
    (lambda d: d.update(first_touch={"bytes": 1 << 26, "fresh_s": 0.01}), "first_touch: reuse_s must be a positive"),
])
def test_malformed_profiles_are_refused_with_the_reason(change, words) -> None:
    with pytest.raises(ir.InvalidClusterError) as err:
        cluster_from_profile(_broken(change))
    assert words in str(err.value)


def test_a_profile_of_another_machine_kind_is_refused() -> None:
    with pytest.raises(ir.InvalidClusterError) as err:
        cluster_from_profile(synthetic_profile(), expect_kind="cuda/NVIDIA H100 80GB HBM3")
    assert f"measured on {KIND!r}, but this machine is 'cuda/NVIDIA H100 80GB HBM3'" in str(err.value)
    assert "meshplan calibrate" in str(err.value)


def test_unreadable_or_non_json_files(tmp_path) -> None:
    with pytest.raises(ir.InvalidClusterError, match="cannot read profile"):
        parse_cluster(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ir.InvalidClusterError, match="is not valid JSON"):
        parse_cluster(str(bad))
    preset_like = tmp_path / "preset.json"
    preset_like.write_text(json.dumps({"schema": "meshplan.other/1"}))  # neither a cluster file nor a profile
    with pytest.raises(ir.InvalidClusterError, match="meshplan calibrate --nproc N"):
        parse_cluster(str(preset_like))


def test_the_runtime_writes_the_schema_the_cost_model_reads() -> None:
    from meshplan.cost_model import profile
    from meshplan.runtime import calibrate

    assert calibrate.SCHEMA == profile.SCHEMA


def test_ranks_that_share_cores_lend_them_while_they_wait(make_graph, make_plan, make_gpt) -> None:
    """4 processes on 2 cores: the pipeline bubble is idle time whose core the other ranks use."""
    import dataclasses

    from meshplan.cost_model import estimate

    shared = cluster_from_profile(synthetic_profile())
    assert shared.accelerator.shared_by == 2.0  # 4 processes / 2 cores
    alone = dataclasses.replace(shared, accelerator=dataclasses.replace(shared.accelerator, shared_by=1.0))
    cfg = make_gpt(4, 256, 8, vocab=4096, seq=128)
    pp = make_plan(cfg, shared, global_batch=16, seq_len=128, pp=4, micro_batch=4, dtype="float32")
    dp = make_plan(cfg, shared, global_batch=16, seq_len=128, dp=4, micro_batch=4, dtype="float32")
    graph = make_graph(cfg)
    assert estimate(graph, shared, pp).step_time_s < estimate(graph, alone, pp).step_time_s
    assert estimate(graph, shared, pp).time_s["bubble"] < estimate(graph, alone, pp).time_s["bubble"]
    assert estimate(graph, shared, dp).step_time_s == pytest.approx(estimate(graph, alone, dp).step_time_s)


def test_sync_after_compute_is_the_excess_over_compute_and_the_fitted_all_reduce() -> None:
    call_s, bus = TRUE[("all-reduce", 4)]
    alone = call_s + bus_bytes("all-reduce", 4 << 20, 4) / bus
    data = synthetic_profile()
    assert cluster_from_profile(data).accelerator.sync_overhead_s == 0.0  # absent: nothing charged
    data["sync_after_compute"] = {"group_size": 4, "bytes": 4 << 20, "compute_s": 5e-3, "seconds": 5e-3 + alone + 2e-3}
    assert cluster_from_profile(data).accelerator.sync_overhead_s == pytest.approx(2e-3, rel=1e-6)
    data["sync_after_compute"]["group_size"] = 8
    with pytest.raises(ir.InvalidClusterError, match="group_size must be 2 to processes"):
        cluster_from_profile(data)


def _framework_rows(data: dict) -> dict:
    """The FSDP and TP-style rows beside a ``sync_after_compute`` of no excess: FSDP units cost 1 ms
    each pass beyond their bare calls; a styled Linear 0.3 ms forward and 0.5 ms backward beyond its
    ops, which cost 10 us (DTensor) and 2 us (plain) each."""
    call_s, bus = TRUE[("all-reduce", 4)]
    alone = call_s + bus_bytes("all-reduce", 4 << 20, 4) / bus
    data["sync_after_compute"] = {"group_size": 4, "bytes": 4 << 20, "compute_s": 5e-3, "seconds": 5e-3 + alone}
    data["op_overhead"] = {"plain_s": 2e-6, "dtensor_s": 10e-6, "plain_dispatches": 1, "dtensor_dispatches": 1}
    data["fsdp"] = {"units": 4, "bare_s": 3e-3, "seconds": 3e-3 + 4 * 2 * 1e-3}
    ops = {"by_hand_fwd_ops": {"plain": 8, "dtensor": 0, "collectives": 0},
           "by_hand_both_ops": {"plain": 27, "dtensor": 0, "collectives": 0},
           "styled_fwd_ops": {"plain": 6, "dtensor": 4, "collectives": 1},
           "styled_both_ops": {"plain": 13, "dtensor": 18, "collectives": 2}}
    charged = {k: v["plain"] * 2e-6 + v["dtensor"] * 10e-6 for k, v in ops.items()}
    hand_f, hand_b = 1e-3, 2.5e-3
    data["tp_linear"] = {"linears": 2, **ops, "by_hand_fwd_s": hand_f + charged["by_hand_fwd_ops"],
                         "by_hand_both_s": hand_b + charged["by_hand_both_ops"],
                         "styled_fwd_s": hand_f + 2 * 0.3e-3 + charged["styled_fwd_ops"],
                         "styled_both_s": hand_b + 2 * (0.3e-3 + 0.5e-3) + charged["styled_both_ops"]}
    return data


def test_framework_costs_are_the_excess_over_the_bare_counterparts() -> None:
    plain = cluster_from_profile(synthetic_profile()).accelerator
    assert plain.fsdp_unit_s == plain.tp_style_fwd_s == plain.tp_style_bwd_s == 0.0  # absent: nothing charged
    accel = cluster_from_profile(_framework_rows(synthetic_profile())).accelerator
    assert accel.fsdp_unit_s == pytest.approx(1e-3)
    assert accel.tp_style_fwd_s == pytest.approx(0.3e-3)
    assert accel.tp_style_bwd_s == pytest.approx(0.5e-3)
    alone = _framework_rows(synthetic_profile())
    del alone["sync_after_compute"]  # the framework rows do not need it
    assert cluster_from_profile(alone).accelerator.fsdp_unit_s == pytest.approx(1e-3)
    # a styled MLP no slower than the same work by hand costs nothing more, never less than nothing
    data = _framework_rows(synthetic_profile())
    data["tp_linear"]["styled_both_s"] = data["tp_linear"]["styled_fwd_s"] = 1e-4
    data["fsdp"]["seconds"] = 1e-3
    accel = cluster_from_profile(data).accelerator
    assert accel.fsdp_unit_s == accel.tp_style_fwd_s == accel.tp_style_bwd_s == 0.0


@pytest.mark.parametrize("change, words", [
    (lambda d: d["fsdp"].pop("bare_s"), "fsdp: bare_s must be a positive number"),
    (lambda d: d["tp_linear"]["styled_fwd_ops"].update(dtensor=-1), "tp_linear: dtensor must be a count >= 0"),
    (lambda d: d["tp_linear"].pop("by_hand_both_ops"), "by_hand_both_ops"),
])
def test_malformed_framework_rows_are_refused(change, words) -> None:
    data = _framework_rows(synthetic_profile())
    change(data)
    with pytest.raises(ir.InvalidClusterError) as err:
        cluster_from_profile(data)
    assert words in str(err.value)


def test_framework_costs_are_charged_where_the_runtime_pays_them(make_graph, make_plan, make_gpt) -> None:
    """FSDP2's per-unit cost under ZeRO-3 and beside TP, never under DDP; the styles' cost under TP only."""
    import dataclasses

    from meshplan.cost_model import estimate

    cfg = make_gpt(4, 256, 8, vocab=4096, seq=128)
    graph = make_graph(cfg)
    base = cluster_from_profile(_framework_rows(synthetic_profile()))
    free = dataclasses.replace(base, accelerator=dataclasses.replace(base.accelerator, fsdp_unit_s=0.0,
                                                                     tp_style_fwd_s=0.0, tp_style_bwd_s=0.0))
    kw = dict(global_batch=16, seq_len=128, micro_batch=4, dtype="float32")
    plans = {"ddp": make_plan(cfg, base, dp=4, **kw), "zero3": make_plan(cfg, base, dp=4, zero=3, **kw),
             "tp": make_plan(cfg, base, tp=4, **{**kw, "micro_batch": 16}),
             "tp_dp": make_plan(cfg, base, tp=2, dp=2, **{**kw, "micro_batch": 8})}
    extra = {k: estimate(graph, base, p).step_time_s - estimate(graph, free, p).step_time_s for k, p in plans.items()}
    assert extra["ddp"] == pytest.approx(0.0, abs=1e-12)
    units = cfg.layers + 1  # a unit per block and the root
    assert extra["zero3"] == pytest.approx(units * 2 * 1e-3, rel=1e-6)  # one micro-batch: forward and backward
    styled = cfg.layers * 6 + 2  # q, k, v, o, fc1, fc2 per block; the embedding and the output head
    assert extra["tp"] == pytest.approx(styled * (0.3e-3 + 0.5e-3), rel=1e-6)
    # plain DP beside TP runs as FSDP2 (HSDP with a shard group of one): both costs
    assert extra["tp_dp"] == pytest.approx(styled * 0.8e-3 + units * 2 * 1e-3, rel=1e-6)
