"""Clusters as data: a cluster file (the presets' format) read by ``parse_cluster``, what its numbers
change in a prediction and in the chosen plan, and every malformed spec or file refused with the field,
the value and the rule."""
from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path

import pytest

from meshplan import cli, ir, zoo
from meshplan.cost_model import (BUS_EFFICIENCY, DEFAULT_SOFTWARE, Cluster, Collective, TierKind, collective_time,
                                 estimate, parse_cluster, preset_data, preset_names, software_named)
from meshplan.cost_model.files import MAX_FILE_BYTES
from meshplan.ir.limits import MAX_GPUS

PRESETS = Path(__file__).resolve().parents[2] / "cost_model" / "presets"


def _n(value, source="test"):
    return {"value": value, "source": source}


def four_by_100g(nodes: int = 2) -> dict:
    """H100 nodes whose network is 4 x 100 Gb/s links per node (the preset: a 400 Gb/s NIC per GPU)."""
    nvlink = copy.deepcopy(preset_data("h100-sxm")["tiers"][0])
    return {"schema": "meshplan.cluster/1", "name": "h100-4x100g", "description": "H100 with a slow network",
            "nodes": _n(nodes), "gpus_per_node": _n(8), "accelerator": "h100-sxm",
            "tiers": [nvlink, {"name": "ethernet", "kind": "scale-out", "domain_size": _n("world"),
                               "links_per_node": _n(4), "link_Gbps": _n(100), "latency_s": _n(6e-6)}]}


def write(tmp_path: Path, data, name: str = "cluster.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# --- the format --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(set(preset_names()) - {"cpu"}))
def test_every_preset_is_a_cluster_file(name: str) -> None:
    from_file = parse_cluster(str(PRESETS / f"{name}.json"))
    preset = Cluster.preset(name)
    assert from_file.spec == str(PRESETS / f"{name}.json")
    assert (from_file.accelerator, from_file.tiers, from_file.nodes, from_file.gpus_per_node) == \
        (preset.accelerator, preset.tiers, preset.nodes, preset.gpus_per_node)


@pytest.mark.parametrize("name, world, net_Bps", [("a100-4x100g", 128, (6.25e9,)),
                                                   ("h100-rail-fat-tree", 512, (50e9, 25e9))])
def test_the_example_cluster_files_load_with_a_source_for_every_number(name, world, net_Bps) -> None:
    path = PRESETS.parents[1] / "examples" / "clusters" / f"{name}.json"
    cluster = parse_cluster(str(path))
    assert cluster.world_size == world and tuple(t.bandwidth_Bps for t in cluster.tiers[1:]) == net_Bps

    def unsourced(node, where=""):
        if isinstance(node, dict):
            if "value" in node:
                return [] if str(node.get("source", "")).strip() else [where]
            return [p for k, v in node.items() for p in unsourced(v, f"{where}.{k}")]
        if isinstance(node, list):
            return [p for i, v in enumerate(node) for p in unsourced(v, f"{where}[{i}]")]
        return [where] if isinstance(node, (int, float)) else []

    assert unsourced(json.loads(path.read_text())) == []


def test_links_per_node_set_the_per_gpu_bandwidth_and_the_accelerator_comes_from_a_preset(tmp_path) -> None:
    cluster = parse_cluster(write(tmp_path, four_by_100g()))
    assert (cluster.nodes, cluster.gpus_per_node, cluster.world_size) == (2, 8, 16)
    assert cluster.accelerator == Cluster.preset("h100-sxm").accelerator
    net = cluster.tiers[1]
    assert net.bandwidth_Bps == pytest.approx(4 * 100e9 / 8 / 8)  # 6.25 GB/s per GPU, per direction
    assert net.domain_size == 16 and net.kind == TierKind.SCALE_OUT


def test_the_accelerator_may_be_given_as_numbers_each_with_a_source(tmp_path) -> None:
    data = four_by_100g()
    data["accelerator"] = copy.deepcopy(preset_data("a100-80gb")["accelerator"])
    data["accelerator"]["memory_bytes"] = _n(40e9, "A100 40GB datasheet")
    cluster = parse_cluster(write(tmp_path, data))
    assert cluster.accelerator.memory_bytes == 40e9 and cluster.accelerator.peak("bfloat16") == 312e12


def test_rail_optimized_fat_tree_slows_only_groups_that_cross_the_spine(tmp_path) -> None:
    """Leaves join 2 nodes at full rate; the spine above them is 2:1 oversubscribed."""
    def fat_tree(oversubscription: float) -> Cluster:
        data = four_by_100g(nodes=4)
        leaf = copy.deepcopy(preset_data("h100-sxm")["tiers"][1]) | {"name": "leaf", "domain_size": _n(16)}
        spine = copy.deepcopy(leaf) | {"name": "spine", "domain_size": _n("world"),
                                       "oversubscription": _n(oversubscription)}
        data["tiers"] = [data["tiers"][0], leaf, spine]
        return parse_cluster(write(tmp_path, data, f"tree{oversubscription}.json"))

    full, half = fat_tree(1), fat_tree(2)
    assert half.tiers[2].bandwidth_Bps == full.tiers[2].bandwidth_Bps / 2 == 25e9
    tokens = 2 * 4096 * 8 * 4096  # an expert-parallel all-to-all of bf16 activations
    inside_leaf = [collective_time(Collective.ALL_TO_ALL, tokens, 16, 1, c) for c in (full, half)]
    across = [collective_time(Collective.ALL_TO_ALL, tokens, 32, 1, c) for c in (full, half)]
    assert inside_leaf[0] == inside_leaf[1]
    # across the spine half of each rank's data leaves its leaf: S/2 over the spine's rate sets the time
    assert across[0] == pytest.approx(tokens / 2 / (50e9 * BUS_EFFICIENCY[TierKind.SCALE_OUT]), rel=0.02)  # + latency
    assert across[1] == pytest.approx(2 * across[0], rel=0.02)


# --- what the numbers change ---------------------------------------------------------------------------

def _allreduce_s(grad_bytes: float, nvlink_Bps: float, net_Bps: float) -> float:
    """By hand: 2 nodes of 8 GPUs, a hierarchical all-reduce whose slowest phase sets the time
    (collectives.py): 8 ranks on NVLink over the whole buffer, 2 ranks on the network over an eighth."""
    nvlink = grad_bytes * 2 * 7 / 8 / (nvlink_Bps * BUS_EFFICIENCY[TierKind.SCALE_UP])
    network = grad_bytes / 8 * 2 * 1 / 2 / (net_Bps * BUS_EFFICIENCY[TierKind.SCALE_OUT])
    return max(nvlink, network)


def test_a_slower_network_exposes_the_data_parallel_all_reduce_by_what_its_numbers_say(
        tmp_path, make_graph, make_plan, make_gpt) -> None:
    """The same pinned dp=16 plan on the preset (8 x 400 Gb/s per node) and on 4 x 100 Gb/s per node.
    Without overlap (Megatron-LM 2021 reduces after the backward) the exposed communication grows by the
    all-reduce's growth computed from the two files' numbers; with meshplan's overlapped buckets it
    still grows, and so does the step."""
    cfg = make_gpt(24, 2048, 16)
    fast, slow = parse_cluster("h100-sxm:2x8"), parse_cluster(write(tmp_path, four_by_100g()))
    graph, grad_bytes = make_graph(cfg), 2 * zoo.param_count(cfg)

    def predict(cluster, software):
        plan = make_plan(cfg, cluster, global_batch=64, seq_len=2048, dp=16, micro_batch=4)
        return estimate(graph, cluster, plan, software=software_named(software))

    serial = [predict(c, "megatron-lm-2021").time_s["exposed_comm"] for c in (fast, slow)]
    expected = _allreduce_s(grad_bytes, 450e9, 4 * 100e9 / 8 / 8) - _allreduce_s(grad_bytes, 450e9, 50e9)
    assert expected > 0.04  # 4.6x the preset's all-reduce: the network phase now sets the time
    assert serial[1] - serial[0] == pytest.approx(expected, rel=0.1)
    overlapped = [predict(c, "meshplan") for c in (fast, slow)]
    assert overlapped[1].time_s["exposed_comm"] > 2 * overlapped[0].time_s["exposed_comm"]
    assert overlapped[1].step_time_s > overlapped[0].step_time_s


def test_a_slower_network_changes_the_chosen_plan(tmp_path) -> None:
    """llama3-8b, batch 32 x 2048 on 2 x 8 H100s: on 4 x 100 Gb/s per node (the preset: a 400 Gb/s NIC
    per GPU) the planner moves fewer bytes across nodes than on the preset. Seen: ZeRO-2 over 16 ranks
    on the preset, pp=4 x dp=4 on the slow network (at 4096 tokens per sequence ZeRO-2 over 16 ranks
    wins on both: more compute to hide the same gathers under). What must hold whatever the plans:
    they differ, and the preset's plan, pinned on the slow network, is predicted slower there than the
    plan chosen for it."""
    import meshplan as mp

    slow_path = write(tmp_path, four_by_100g())
    fast = mp.autoparallelize("llama3-8b", "h100-sxm:2x8", global_batch=32, seq_len=2048)
    slow = mp.autoparallelize("llama3-8b", slow_path, global_batch=32, seq_len=2048)
    choice = lambda p: (p.mesh, p.zero_stage, p.micro_batch_size)  # noqa: E731
    assert choice(slow) != choice(fast), (fast.summary(), slow.summary())
    m = fast.mesh
    pinned = mp.autoparallelize("llama3-8b", slow_path, global_batch=32, seq_len=2048,
                                fixed={"dp": m.dp, "tp": m.tp, "pp": m.pp, "cp": m.cp, "zero": fast.zero_stage,
                                       "micro_batch": fast.micro_batch_size})
    assert slow.prediction.step_time_s < pinned.prediction.step_time_s, (slow.summary(), pinned.summary())
    assert pinned.prediction.step_time_s > fast.prediction.step_time_s  # the same plan on a slower network
    assert slow.cluster == slow_path


# --- malformed specs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, words", [
    ("h100-sxm:99999999999999999999x8", ["nodes 99999999999999999999", "limit of 10000000", "MAX_GPUS"]),
    ("h100-sxm:2000000x8", ["nodes(2000000) * gpus_per_node(8) = 16000000", "limit of 10000000"]),
    ("h100-sxm:" + "9" * 4000 + "x8", ["exceeds the limit", "(4000 characters)"]),
    ("h100-sxm:0x8", ["nodes must be at least 1, got 0"]),
    ("h100-sxm:1x" + "9" * 30, ["gpus_per_node", "limit of 10000000"]),
    ("x" * 5000, ["longer than 4096 characters"]),
])
def test_bad_specs_name_the_field_the_value_and_the_rule(spec: str, words: list[str]) -> None:
    with pytest.raises(ir.InvalidClusterError) as err:
        parse_cluster(spec)
    for word in words:
        assert word in str(err.value)
    assert len(str(err.value)) < 600


def test_a_cluster_value_above_max_gpus_is_refused() -> None:
    small = Cluster.preset("h100-sxm")
    with pytest.raises(ir.InvalidClusterError, match=f"exceeds the limit of {MAX_GPUS}"):
        Cluster(accelerator=small.accelerator, nodes=MAX_GPUS, gpus_per_node=8, tiers=small.tiers)


# --- malformed files ----------------------------------------------------------------------------------

def _set(path: str, value):
    """A change to four_by_100g(): put ``value`` at the dotted ``path`` (a trailing '-' deletes)."""
    def change(data: dict) -> dict:
        keys = [int(k) if k.isdigit() else k for k in path.rstrip("-").split(".")]
        node = data
        for k in keys[:-1]:
            node = node[k]
        if path.endswith("-"):
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
        return data
    return change


@pytest.mark.parametrize("change, words", [
    (_set("nodes", _n(0)), ["nodes: value must be a whole number >= 1, got 0"]),
    (_set("nodes", _n(2.5)), ["nodes: value must be a whole number >= 1, got 2.5"]),
    (_set("nodes", _n(True)), ["nodes: value must be a whole number >= 1, got True"]),
    (_set("nodes", _n(2_000_000)), ["nodes(2000000) * gpus_per_node(8) = 16000000", "limit of 10000000"]),
    (_set("nodes", _n(10**30)), ["nodes: value 1000000000000000000000000000000 exceeds the limit of 10000000"]),
    (_set("gpus_per_node", _n(-8)), ["gpus_per_node: value must be a whole number >= 1, got -8"]),
    (_set("tiers.1.latency_s", _n(-1e-6)), ["tiers[1].latency_s: value must be a finite number >= 0, got -1e-06"]),
    (_set("tiers.0.bandwidth_Bps", _n(-450e9)), ["tiers[0].bandwidth_Bps: value must be a finite number >= 0"]),
    (_set("tiers.0.bandwidth_Bps", _n(0)), ["tiers[0].bandwidth_Bps: value must be a number > 0", "got 0"]),
    (_set("tiers.1.link_Gbps", _n(0.0)), ["tiers[1].link_Gbps: value must be a number > 0", "got 0.0"]),
    (_set("tiers.1.link_Gbps", _n("fast")), ["tiers[1].link_Gbps: value must be a finite number >= 0, got 'fast'"]),
    (_set("tiers.1.link_Gbps-", None), ["either as bandwidth_Bps", "not ['links_per_node']"]),
    (_set("tiers.1.bandwidth_Bps", _n(1e9)), ["either as bandwidth_Bps", "not ['bandwidth_Bps', 'link_Gbps'"]),
    (_set("tiers.1.oversubscription", _n(0.5)), ["oversubscription: value must be >= 1", "got 0.5"]),
    (_set("tiers.1.domain_size", _n(12)), ["a domain of 12 GPUs does not split into nodes of 8"]),
    (_set("tiers.1.domain_size", _n("rack")), ["domain_size must be a whole number of GPUs", "got 'rack'"]),
    (_set("tiers.1.kind", "warp"), ["kind 'warp' is not one of"]),
    (_set("tiers", []), ["tiers: expected a non-empty list"]),
    (_set("tiers.1.bandwith_Bps", _n(1e9)), ["unknown key 'bandwith_Bps'", "did you mean 'bandwidth_Bps'?"]),
    (_set("node_count", _n(4)), ["unknown key 'node_count'", "the keys of a cluster are"]),
    (_set("accelerator", {**preset_data("h100-sxm")["accelerator"], "tflops": _n(1)}), ["unknown key 'tflops'"]),
    (_set("nodes", {"value": 2, "source": "x", "unit": "nodes"}), ["nodes: unknown key 'unit'"]),
    (_set("nodes", {"value": 2}), ["nodes: every number needs a non-empty \"source\""]),
    (_set("nodes", 2), ["nodes: expected {\"value\": ..., \"source\": \"...\"}, got 2"]),
    (_set("accelerator", "h900"), ["accelerator: 'h900' is not a preset", "h100-sxm"]),
    (_set("accelerator", {**preset_data("h100-sxm")["accelerator"], "memory_bw_Bps": _n(-1)}),
     ["accelerator.memory_bw_Bps: value must be a finite number >= 0, got -1"]),
    (_set("accelerator", {**preset_data("h100-sxm")["accelerator"], "matmul_efficiency": {"bfloat16": _n(1.5)}}),
     ["matmul_efficiency covers"]),
    (_set("schema", "meshplan.cluster/2"), ["schema 'meshplan.cluster/2'", "meshplan.profile/1"]),
])
def test_malformed_cluster_files_are_refused_with_the_field_value_and_rule(tmp_path, change, words) -> None:
    with pytest.raises(ir.InvalidClusterError) as err:
        parse_cluster(write(tmp_path, change(four_by_100g())))
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("text, words", [
    ('{"schema": "meshplan.cluster/1", "nodes": {"value": NaN, "source": "x"}}', ["nodes.value is not a finite"]),
    ('{"schema": "meshplan.cluster/1", "nodes": {"value": Infinity, "source": "x"}}', ["nodes.value is not a finite"]),
    ('{"schema": "meshplan.cluster/1", "tiers": [{"latency_s": {"value": -Infinity}}]}',
     ["tiers[0].latency_s.value is not a finite"]),
    ('{"schema": "meshplan.cluster/1", "nodes": {"value": 1e999, "source": "x"}}', ["nodes.value is not a finite"]),
    ('{"schema": "meshplan.profile/1", "small_op_s": NaN}', ["small_op_s is not a finite"]),
    ('{"schema": "meshplan.cluster/1", "nodes": {"value": 1' + "0" * 5000 + ', "source": "x"}}',
     ["is not valid JSON", "digits"]),
    ("[" * 100_000 + "]" * 100_000, ["nested 65 deep, more than the limit of 64"]),
    ("[1, 2]", ["schema 'list'"]),
    ("{not json", ["is not valid JSON", "line 1"]),
])
def test_non_finite_or_unparsable_files_are_refused(tmp_path, text: str, words: list[str]) -> None:
    with pytest.raises(ir.InvalidClusterError) as err:
        parse_cluster(write(tmp_path, text))
    for word in words:
        assert word in str(err.value)


def test_non_utf8_files_are_refused(tmp_path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(four_by_100g()).replace("slow network", "r\u00e9seau lent").encode("latin-1"))
    with pytest.raises(ir.InvalidClusterError, match=r"not UTF-8 text: byte 0xe9 at offset \d+"):
        parse_cluster(str(path))


def test_oversized_files_are_refused_before_reading(tmp_path) -> None:
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: no bytes are written, and none may be read
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(ir.InvalidClusterError, match=f"more than the limit of {MAX_FILE_BYTES}"):
        parse_cluster(str(path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path) -> None:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            parse_cluster(str(path))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():  # unblock the reader so the thread ends, then fail
        with open(path, "wb"):
            pass
        pytest.fail("parse_cluster blocked on a FIFO")
    assert isinstance(outcome[0], ir.InvalidClusterError) and "not a regular file" in str(outcome[0])


def test_directories_and_missing_paths_are_refused(tmp_path) -> None:
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ir.InvalidClusterError, match="not a regular file"):
        parse_cluster(str(tmp_path / "dir.json"))
    with pytest.raises(ir.InvalidClusterError, match="No such file"):
        parse_cluster(str(tmp_path / "absent.json"))


def test_the_cli_takes_a_cluster_file_and_refuses_a_bad_one_in_one_line(tmp_path, capsys) -> None:
    good = write(tmp_path, four_by_100g(), "good.json")
    args = ["estimate", "--model", "gpt-tiny", "--global-batch", "16", "--seq-len", "16", "--dp", "16"]
    assert cli.main([*args, "--cluster", good]) == 0
    assert f"on {good} (16 GPUs)" in capsys.readouterr().out
    bad = write(tmp_path, _set("tiers.1.latency_s", _n(float("nan")))(four_by_100g()), "bad.json")
    assert cli.main([*args, "--cluster", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "latency_s.value is not a finite number" in err and "Traceback" not in err


# --- the fused attention's rate by sequence length ------------------------------------------------------

def test_attention_follows_the_published_curve_by_sequence_length() -> None:
    """The A100 preset carries FlashAttention-2's forward+backward rate at 512..16k tokens (FA2 paper Fig. 4):
    the efficiency is read off it (linear in log2 of the length between points, the nearest end beyond), so
    the same attention FLOPs run faster on long sequences."""
    accel = Cluster.preset("a100-80gb").accelerator
    curve = dict(accel.attention_by_seq_len)
    assert curve[2048] == pytest.approx(155 / 312, abs=1e-3) and curve[16384] == pytest.approx(189 / 312, abs=1e-3)
    assert accel.attention_at(None, 2048) == (curve[2048], 2.5)
    mid = accel.attention_at(None, 2048 * 2 ** 0.5)[0]
    assert mid == pytest.approx((curve[2048] + curve[4096]) / 2)
    assert accel.attention_at(None, 128)[0] == curve[512] and accel.attention_at(None, 1 << 20)[0] == curve[16384]
    assert accel.attention_at(None)[0] == accel.attention_efficiency  # no length: the flat figure


def test_cudnn_attention_follows_nvidia_s_training_benchmark_where_the_program_runs_it() -> None:
    """The GB200 and GB300 presets carry cuDNN's training SDPA benchmark (NVIDIA/cudnn-frontend
    benchmark/sdpa_benchmark_training/results/llama3.1, bf16, causal, 64 x 128 query heads): forward TFLOP/s
    over the 2500 TF peak and the backward's time over the forward's. A program that runs cuDNN (Transformer
    Engine: the Megatron-Core perf-recipes preset) is timed on that curve; one that runs FlashAttention-2
    (meshplan's SDPA) keeps the preset's default figure; and Blackwell Ultra's faster attention shows."""
    from meshplan.cost_model.kernels import attention_fwd_bwd_s

    gb200, gb300 = (Cluster.preset(n).accelerator for n in ("gb200-nvl72", "gb300-nvl72"))
    curve = {s: (e, r) for s, e, r in gb200.cudnn_attention_by_seq_len}
    assert curve[8192][0] == pytest.approx(1574 / 2500, abs=1e-3)  # the csv's 8k forward: 1.397 ms, 1574 TF
    assert curve[8192][1] == pytest.approx(4.127 / 1.397, abs=0.01)  # its backward: 4.127 ms
    assert gb200.attention_at(128, 8192, "cudnn") == curve[8192]
    assert gb200.attention_at(128, 8192, "fa2") == gb200.attention_at(128, 8192) == (gb200.attention_efficiency, 2.5)
    flops = 4 * 2 * 64 * 8192 * 8192 * 128  # b=2, 64 heads, 8k: the benchmark's row
    fwd, bwd = attention_fwd_bwd_s(gb200, "bfloat16", flops, seq_len=8192, kernel="cudnn")
    assert fwd == pytest.approx(1.397e-3 + gb200.kernel_overhead_s, rel=0.01) and bwd == pytest.approx(4.127e-3, rel=0.01)
    ultra = sum(attention_fwd_bwd_s(gb300, "bfloat16", flops, seq_len=8192, kernel="cudnn"))
    assert ultra == pytest.approx((1.185 + 3.832) / (1.397 + 4.127) * (fwd + bwd), rel=0.01)  # GB300: 9% faster
    a100 = Cluster.preset("a100-80gb").accelerator  # no cuDNN curve: the kernel falls back to the default one
    assert a100.attention_at(128, 4096, "cudnn") == a100.attention_at(128, 4096)


def _h100_numbers() -> dict:
    """A cluster file of two nodes whose accelerator is the h100-sxm preset's numbers, written out."""
    data = four_by_100g()
    data["accelerator"] = copy.deepcopy(preset_data("h100-sxm")["accelerator"])
    return data


@pytest.mark.parametrize("field, value, rule", [
    ("attention_by_seq_len", [[2048, 0.5], [1024, 0.4]], "increasing"),
    ("attention_by_seq_len", [[1024, 1.5]], "efficiency in"), ("attention_by_seq_len", [], "pairs"),
    ("attention_by_seq_len", [[1024, "fast"]], "pairs"), ("attention_by_seq_len", 0.5, "pairs"),
    ("cudnn_attention_by_seq_len", [[2048, 0.5]], "triples"),
    ("cudnn_attention_by_seq_len", [[2048, 0.5, 3.0], [1024, 0.4, 3.0]], "increasing"),
    ("cudnn_attention_by_seq_len", [[2048, 0.5, -1.0]], "backward ratio > 0"),
    ("cudnn_window_attention", [[128, 64, 0.06]], "4-tuples"),
    ("cudnn_window_attention", [[128, 64, 1.5, 2.2]], "efficiency in"),
    ("flops_per_exp", -256.0, ">= 0"), ("flops_per_exp", "many", "finite number"),
    ("host_link_Bps", -1.0, ">= 0"), ("host_link_Bps", "fast", "finite number"),
    ("host_link_Bps", float("inf"), "finite"), ("host_memory_bytes", -1.0, ">= 0"),
    ("host_memory_bytes", "big", "finite number"), ("ordered_comm_overlap", 1, "true or false"),
    ("ordered_comm_overlap", "yes", "true or false")])
def test_a_malformed_accelerator_field_is_refused_naming_it(tmp_path, field, value, rule) -> None:
    data = _h100_numbers()
    data["accelerator"][field] = _n(value)
    with pytest.raises(ir.InvalidClusterError, match=rf"{field}(.|\n)*{rule}"):
        parse_cluster(write(tmp_path, data))


def test_a_host_link_in_a_cluster_file_sets_the_offload_copies(tmp_path, make_graph, make_plan, make_gpt) -> None:
    """A faster host link (NVLink-C2C's 225 GB/s given to an H100 node's numbers) shortens an offloaded plan's
    step by exactly its copies' share: each layer's activations over the link, out and back, per micro-batch."""
    from meshplan.cost_model.footprint import offloaded_layer_bytes
    from meshplan.cost_model.summary import summary_of

    data = _h100_numbers()
    slow = parse_cluster(write(tmp_path, data, "slow.json"))
    data["accelerator"]["host_link_Bps"] = _n(225e9)
    fast = parse_cluster(write(tmp_path, data, "fast.json"))
    assert (slow.accelerator.host_link_Bps, fast.accelerator.host_link_Bps) == (64e9, 225e9)
    cfg = make_gpt(8, 2048, 16, seq=2048)
    graph = make_graph(cfg)
    plan = make_plan(cfg, slow, global_batch=32, seq_len=2048, dp=slow.world_size, zero=3, recompute="offload")
    copies = 2 * cfg.layers * plan.num_microbatches * offloaded_layer_bytes(summary_of(graph), plan, DEFAULT_SOFTWARE)
    t_slow, t_fast = (estimate(graph, c, plan).step_time_s for c in (slow, fast))
    # exposed copies, outside the compute the preset's calibration scales (estimate.calibrated)
    assert t_slow - t_fast == pytest.approx(copies / 64e9 - copies / 225e9, rel=1e-6)
