"""``meshplan calibrate`` on this machine: two gloo ranks write a profile that the cost model reads
back as a cluster of this kind of machine (and refuses as another kind)."""
from __future__ import annotations

import json

import pytest

from meshplan import ir
from meshplan.cost_model import Cluster, collective_time, parse_cluster
from meshplan.runtime import calibrate

pytestmark = pytest.mark.slow


def test_calibrate_writes_a_profile_the_cost_model_reads(tmp_path) -> None:
    path = tmp_path / "profile.json"
    assert calibrate.main(["--nproc", "2", "-o", str(path)]) == 0
    profile = json.loads(path.read_text())
    assert profile["schema"] == "meshplan.profile/1" and profile["processes"] == 2
    assert {"all-reduce", "all-gather", "reduce-scatter"} <= set(profile["collectives"])
    cluster = Cluster.from_profile(str(path), expect_kind=calibrate.machine_kind())
    assert cluster.world_size == 2 and "float32" in cluster.accelerator.peak_flops
    assert collective_time("all-reduce", 4 << 20, 2, 1, cluster) > collective_time("all-reduce", 16 << 10, 2, 1,
                                                                                    cluster)
    assert parse_cluster(str(path)).accelerator == cluster.accelerator
    # the framework's cost per dispatched op (the chain's ops counted, ~6 each) and the transcendental rates
    assert 4 <= profile["op_overhead"]["plain_dispatches"] <= 8 and 4 <= profile["op_overhead"]["dtensor_dispatches"] <= 8
    accel = cluster.accelerator
    assert 0 < accel.dispatch_s < accel.dtensor_dispatch_s
    assert {op for op, _ in accel.transcendental_s_per_elem} == {"gelu", "gelu_backward", "log_softmax",
                                                                  "log_softmax_backward", "sqrt"}
    assert accel.first_touch_s_per_byte >= 0 and profile["first_touch"]["bytes"] >= 32 << 20
    # the framework rows: the styled MLP's ops as DTensor counts them (an all-reduce forward, one for the
    # input's gradient backward; the by-hand twin issues its all-reduces outside the dispatcher)
    tp = profile["tp_linear"]
    assert tp["styled_fwd_ops"]["collectives"] == 1 and tp["styled_both_ops"]["collectives"] == 2
    assert tp["styled_both_ops"]["dtensor"] > tp["styled_fwd_ops"]["dtensor"] > 0
    assert tp["by_hand_both_ops"]["dtensor"] == 0 and tp["by_hand_both_ops"]["plain"] > 0
    assert profile["fsdp"]["units"] >= 1 and profile["fsdp"]["seconds"] > 0
    assert accel.fsdp_unit_s >= 0 and accel.tp_style_fwd_s >= 0 and accel.tp_style_bwd_s >= 0
    with pytest.raises(ir.InvalidClusterError, match="but this machine is 'cuda/Other GPU'"):
        Cluster.from_profile(str(path), expect_kind="cuda/Other GPU")


def test_bad_nproc_is_one_line(capsys, tmp_path) -> None:
    assert calibrate.main(["--nproc", "0", "-o", str(tmp_path / "p.json")]) == 2
    assert "--nproc must be at least 1" in capsys.readouterr().err
