"""Cluster values, preset data files and the NAME:NODESxGPUS spec."""
from __future__ import annotations

import dataclasses

import pytest

from meshplan import ir
from meshplan.cost_model import (BUS_EFFICIENCY, Accelerator, Cluster, Tier, TierKind, parse_cluster, preset_data,
                                 preset_names)

REQUIRED = {"cpu", "a100-80gb", "h100-sxm", "h200", "b200", "gb200-nvl72", "mi300x", "tpu-v5p", "tpu-v6e"}


def _numbers_without_source(node, where="") -> list[str]:
    """Paths of numbers in a preset that are not wrapped as {"value", "source"}."""
    if isinstance(node, dict):
        if "value" in node:
            return [] if isinstance(node.get("source"), str) and node["source"].strip() else [where]
        return [p for k, v in node.items() for p in _numbers_without_source(v, f"{where}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _numbers_without_source(v, f"{where}[{i}]")]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return [where]
    return []


def test_required_presets_exist_and_load() -> None:
    assert REQUIRED <= set(preset_names())
    for name in preset_names():
        cluster = Cluster.preset(name)
        assert cluster.name == name and cluster.world_size >= 1


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_number_has_a_source(name: str) -> None:
    assert _numbers_without_source(preset_data(name)) == []


def test_cpu_preset_is_fp32_four_processes_and_says_it_is_a_placeholder() -> None:
    cpu = parse_cluster("cpu")
    assert cpu.spec == "cpu:1x4" and cpu.world_size == 4
    assert set(cpu.accelerator.peak_flops) == {"float32"}
    assert "calibrate" in preset_data("cpu")["description"]


def test_spec_parsing() -> None:
    c = parse_cluster("h100-sxm:16x8")
    assert (c.nodes, c.gpus_per_node, c.world_size, c.spec) == (16, 8, 128, "h100-sxm:16x8")
    assert parse_cluster("h100-sxm").spec == "h100-sxm:1x8"
    assert Cluster.preset("a100-80gb", nodes=4).spec == "a100-80gb:4x8"
    assert parse_cluster("gb200-nvl72:18x4").tiers[0].domain_size == 72


def test_per_direction_bandwidths_from_the_datasheets() -> None:
    nvlink, ib = Cluster.preset("h100-sxm", nodes=2).tiers
    assert nvlink.bandwidth_Bps == 450e9 and ib.bandwidth_Bps == 50e9  # 900 GB/s bidirectional; 400 Gb/s
    assert nvlink.kind == TierKind.SCALE_UP and ib.kind == TierKind.SCALE_OUT
    assert nvlink.achievable_Bps == pytest.approx(450e9 * BUS_EFFICIENCY[TierKind.SCALE_UP])
    assert Cluster.preset("a100-80gb").tiers[0].bandwidth_Bps == 300e9


@pytest.mark.parametrize("spec, words", [
    ("h100", ["unknown cluster preset", "h100-sxm", "a100-80gb", "cpu"]),
    ("h100-sxm:2", ["NAME:NODESxGPUS, e.g. h100-sxm:16x8"]),
    ("h100-sxm:2x", ["NAME:NODESxGPUS"]),
    ("h100-sxm:0x8", ["nodes must be at least 1, got 0"]),
    ("h100-sxm:-2x8", ["nodes must be at least 1, got -2"]),
    ("h100-sxm:1x0", ["gpus_per_node must be at least 1, got 0"]),
    ("h100-sxm:1x16", ["at most 8 GPUs", "gpus_per_node=16", "h100-sxm:2x8"]),
    ("gb200-nvl72:1x72", ["at most 4 GPUs", "gb200-nvl72:18x4"]),
])
def test_bad_specs_explain_themselves(spec: str, words: list[str]) -> None:
    with pytest.raises(ir.InvalidClusterError) as err:
        parse_cluster(spec)
    for word in words:
        assert word in str(err.value)


def _accel(**over) -> Accelerator:
    base = dict(name="x", peak_flops={"bfloat16": 1e15}, matmul_efficiency={"bfloat16": 0.8}, memory_bytes=80e9,
                reserved_bytes=1e9, memory_bw_Bps=3e12, memory_efficiency=0.8, attention_efficiency=0.5,
                kernel_overhead_s=4e-6, compute_units=100, matmul_tile_elems=32768)
    return Accelerator(**{**base, **over})


@pytest.mark.parametrize("over, words", [
    (dict(peak_flops={"int4": 1e15}, matmul_efficiency={"int4": 0.8}), "unknown dtype 'int4'"),
    (dict(matmul_efficiency={"bfloat16": 1.5}), "fraction in (0, 1]"),
    (dict(matmul_efficiency={}), "one per dtype"),
    (dict(reserved_bytes=90e9), "reserved_bytes"),
    (dict(memory_bw_Bps=0), "positive"),
])
def test_accelerator_validates(over: dict, words: str) -> None:
    with pytest.raises(ir.InvalidClusterError, match=None) as err:
        _accel(**over)
    assert words in str(err.value)


def test_values_are_frozen_hashable_and_equal_by_content() -> None:
    a, b = parse_cluster("h100-sxm:2x8"), Cluster.preset("h100-sxm", nodes=2)
    assert a == b and hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.nodes = 3
    assert a.accelerator.usable_memory_bytes < a.accelerator.memory_bytes


def test_tiers_must_reach_the_whole_cluster_and_go_inside_out() -> None:
    nv = Tier(name="nv", kind="scale-up", domain_size=8, bandwidth_Bps=1e11, latency_s=1e-6)
    with pytest.raises(ir.InvalidClusterError, match="outermost tier"):
        Cluster(accelerator=_accel(), nodes=2, gpus_per_node=8, tiers=(nv,))
    net = Tier(name="net", kind="scale-out", domain_size=4, bandwidth_Bps=1e10, latency_s=1e-6)
    with pytest.raises(ir.InvalidClusterError, match="inner to outer"):
        Cluster(accelerator=_accel(), nodes=1, gpus_per_node=8, tiers=(nv, net))
    with pytest.raises(ir.InvalidClusterError, match="kind"):
        Tier(name="q", kind="quantum", domain_size=8, bandwidth_Bps=1e9, latency_s=0)
