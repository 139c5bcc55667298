"""Clusters as data: preset files ``presets/<name>.json``, cluster files, and the ``NAME:NODESxGPUS`` spec.

A cluster file and a preset are the same format (schema ``meshplan.cluster/1``); a preset is a
cluster file that ships with meshplan. ``parse_cluster`` takes a preset spec (``h100-sxm:16x8``) or
the path of a ``.json`` file: a cluster file, or a profile ``meshplan calibrate`` wrote (schema
``meshplan.profile/1``, raw timings, read by ``profile.py``); the ``schema`` key tells them apart.

Every number is ``{"value": ..., "source": "..."}``: where it comes from (a datasheet, a paper, a
measurement) or, for a placeholder, that it is one. The keys::

    schema            "meshplan.cluster/1"
    name, description strings
    nodes             nodes in the cluster (optional, 1; a spec's NODES replaces it)
    gpus_per_node     GPUs per node; max_gpus_per_node (optional): what one node can hold
    accelerator       a preset's name ("a100-80gb": that preset's numbers and sources), or the numbers
                      themselves: name, peak_flops and matmul_efficiency per dtype, memory_bytes,
                      reserved_bytes, memory_bw_Bps, memory_efficiency, attention_efficiency,
                      kernel_overhead_s, compute_units, matmul_tile_elems (``hardware.Accelerator``), and
                      optionally attention_by_seq_len ([[sequence length, efficiency], ...], published),
                      cudnn_attention_by_seq_len ([[sequence length, forward efficiency, backward time
                      over forward], ...]: cuDNN's fused attention, what Transformer Engine runs),
                      cudnn_window_attention ([[window, head dim, forward efficiency, backward time over
                      forward], ...]: its sliding-window kernel, measured), flops_per_exp (dense 16-bit
                      tensor FLOPs per exponential of an SM: where softmax bounds the attention forward)
                      host_link_Bps (bytes/s each way between a GPU and host memory: what
                      offloaded activations cross; absent or 0: activations are never offloaded) and
                      host_memory_bytes (host memory per GPU, the node's DRAM over its GPUs: what
                      offloaded activations may fill; absent or 0: not checked) and ordered_comm_overlap
                      (true or false: a communication kernel overlaps a GEMM only in launch order, one
                      hardware queue; NVIDIA GPUs before Blackwell; absent: false) and calibration (in
                      (0, 1]: the share of the modelled throughput published runs reach, the rest priced
                      as the step's ``unpriced`` time; absent: 1)
    tiers             inner to outer, each: name, kind ("scale-up", "scale-out", "shared-memory"),
                      domain_size (ranks; "node" = gpus_per_node; "world"), latency_s (per algorithm
                      step), and the bandwidth per GPU and direction, either as bandwidth_Bps or as
                      the node's links: links_per_node x link_Gbps (Gb/s per link and direction)
                      shared by the node's GPUs; optional oversubscription (>= 1) divides it: the
                      tier's traffic crosses switches that carry 1/oversubscription of what enters
                      them (a fat tree's spine), description (a string)

So an A100 node with 4 x 100 Gb/s links is ``links_per_node 4, link_Gbps 100`` on its scale-out
tier (400 Gb/s / 8 GPUs = 6.25 GB/s per GPU, where the preset has 8 x 200 Gb/s = 25 GB/s); a
rail-optimized fat tree is two scale-out tiers: the leaves (domain_size = the GPUs of the nodes
under one leaf group, full rate) and the spine (domain "world", oversubscription 2 for 2:1).

A malformed spec or file is refused with ``InvalidClusterError`` naming the field, the value and
the rule: unknown keys, numbers that are negative, non-finite or not counts where counts are due,
clusters above ``ir.limits.MAX_GPUS``; files are read as ``files.read_json`` reads them.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from ..ir.errors import InvalidClusterError
from ..ir.limits import MAX_GPUS
from .files import read_json
from .hardware import Accelerator, Cluster, Tier

SCHEMA = "meshplan.cluster/1"
PROFILE_SCHEMA = "meshplan.profile/1"  # profile.SCHEMA, written by runtime/calibrate.py
SPEC_FORM = ("NAME:NODESxGPUS, e.g. h100-sxm:16x8, or the path of a cluster file CLUSTER.json "
             "(the presets' format) or of a profile PROFILE.json from `meshplan calibrate`")
MAX_SPEC_CHARS = 4096  # PATH_MAX on Linux: no spec or path is longer
_SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)(?::(-?\d+)x(-?\d+))?$", re.ASCII)  # \d: 0-9 only
_ACCEL_NUMBERS = ("memory_bytes", "reserved_bytes", "memory_bw_Bps", "memory_efficiency", "attention_efficiency",
                  "kernel_overhead_s")
_ACCEL_COUNTS = ("compute_units", "matmul_tile_elems")
_KEYS = {
    "cluster": ("schema", "name", "description", "nodes", "gpus_per_node", "max_gpus_per_node", "accelerator",
                "tiers"),
    "accelerator": ("name", "peak_flops", "matmul_efficiency", *_ACCEL_NUMBERS, *_ACCEL_COUNTS, "attention_by_seq_len",
                    "cudnn_attention_by_seq_len", "cudnn_window_attention", "flops_per_exp", "host_link_Bps",
                    "host_memory_bytes", "ordered_comm_overlap", "calibration"),
    "tier": ("name", "kind", "description", "domain_size", "latency_s", "bandwidth_Bps", "links_per_node",
             "link_Gbps", "oversubscription"),
    "number": ("value", "source"),
}


def preset_names() -> tuple[str, ...]:
    """The names of the preset data files, sorted."""
    files = resources.files("meshplan.cost_model.presets")
    return tuple(sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".json")))


@lru_cache(maxsize=None)
def _preset_text(name: str) -> str:
    if name not in preset_names():
        raise InvalidClusterError(f"unknown cluster preset {name!r}; known presets: {', '.join(preset_names())}")
    return resources.files("meshplan.cost_model.presets").joinpath(f"{name}.json").read_text()


def preset_data(name: str) -> dict[str, Any]:
    """The parsed data file of a preset (numbers with their sources)."""
    return json.loads(_preset_text(name))


def load_preset(name: str, *, nodes: int = 1, gpus_per_node: int | None = None) -> Cluster:
    return cluster_from_dict(preset_data(name), nodes=nodes, gpus_per_node=gpus_per_node)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_cluster(spec: str | os.PathLike) -> Cluster:
    """``"h100-sxm:16x8"`` -> 16 nodes of 8 H100s; a plain ``"h100-sxm"`` is one node; a path ending in
    ``.json`` is a cluster file (schema ``meshplan.cluster/1``) or a profile written by ``meshplan
    calibrate`` (``profile.py``)."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise InvalidClusterError(f"cluster spec must be a string, got {type(spec).__name__}; expected {SPEC_FORM}")
    spec = spec.strip()
    if len(spec) > MAX_SPEC_CHARS:
        raise InvalidClusterError(f"cluster spec {_short(spec)!r} is longer than {MAX_SPEC_CHARS} characters, "
                                  f"more than any path; expected {SPEC_FORM}")
    if spec.endswith(".json"):
        return cluster_from_file(spec)
    match = _SPEC.match(spec)
    if match is None:
        raise InvalidClusterError(f"cluster spec {_short(spec)!r} is not of the form {SPEC_FORM}")
    name, nodes, gpus = match.groups()
    if nodes is None:
        return load_preset(name)
    for key, digits in (("nodes", nodes), ("gpus_per_node", gpus)):
        if len(digits.lstrip("-")) > len(str(MAX_GPUS)):  # refused before int() turns 10^5 digits into a number
            raise InvalidClusterError(f"cluster spec {_short(spec)!r}: {key} {_short(digits, 24)} exceeds the limit "
                                      f"of {MAX_GPUS} (10^7) GPUs meshplan plans for (ir/limits.MAX_GPUS); "
                                      "check the spec for a typo")
    return load_preset(name, nodes=int(nodes), gpus_per_node=int(gpus))


def cluster_from_file(path: str | os.PathLike) -> Cluster:
    """A cluster file or a calibration profile, told apart by its ``schema``."""
    data = read_json(path, "profile or cluster file")
    where = f"cluster file {str(path)!r}"
    schema = data.get("schema") if isinstance(data, dict) else type(data).__name__
    if schema == PROFILE_SCHEMA:
        from .profile import cluster_from_profile

        return cluster_from_profile(path)
    if schema != SCHEMA:
        raise InvalidClusterError(f"{where} has schema {schema!r}, expected {SCHEMA!r} (a cluster file, in the "
                                  f"format of cost_model/presets/*.json) or {PROFILE_SCHEMA!r} (a profile: write one "
                                  "with `meshplan calibrate --nproc N -o PROFILE.json`)")
    return cluster_from_dict(data, spec=str(path), where=where)


def _keys(data: Any, kind: str, where: str) -> dict[str, Any]:
    """``data`` as an object whose keys are among ``_KEYS[kind]``."""
    if not isinstance(data, dict):
        raise InvalidClusterError(f"{where}: expected an object with keys among {list(_KEYS[kind])}, "
                                  f"got {_short(repr(data))}")
    for key in data:
        if key not in _KEYS[kind]:
            close = difflib.get_close_matches(str(key), _KEYS[kind], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidClusterError(f"{where}: unknown key {_short(str(key), 40)!r}; the keys of a {kind} are "
                                      f"{list(_KEYS[kind])}{hint}")
    return data


def _value(entry: Any, where: str) -> Any:
    """The ``value`` of a ``{"value", "source"}`` entry, the source checked."""
    if not isinstance(entry, dict) or "value" not in entry:
        raise InvalidClusterError(f"{where}: expected {{\"value\": ..., \"source\": \"...\"}}, "
                                  f"got {_short(repr(entry))}")
    _keys(entry, "number", where)
    if not isinstance(entry.get("source"), str) or not entry["source"].strip():
        raise InvalidClusterError(f"{where}: every number needs a non-empty \"source\" saying where it comes from")
    return entry["value"]


def _real(entry: Any, where: str) -> float:
    """A finite number >= 0 (each field's own rule, e.g. a fraction, is checked by the value it builds)."""
    value = _value(entry, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidClusterError(f"{where}: value must be a finite number >= 0, got {_short(repr(value))}")
    return float(value)


def _count(entry: Any, where: str) -> int:
    """A whole number from 1 to ``MAX_GPUS``."""
    value = _value(entry, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidClusterError(f"{where}: value must be a whole number >= 1, got {_short(repr(value))}")
    if value > MAX_GPUS:
        raise InvalidClusterError(f"{where}: value {_short(str(value), 40)} exceeds the limit of {MAX_GPUS} "
                                  "(10^7, ir/limits.MAX_GPUS); check it for a typo")
    return value


def _per_dtype(data: Any, where: str) -> dict[str, float]:
    if not isinstance(data, dict):
        raise InvalidClusterError(f"{where}: expected an object of dtype -> {{\"value\", \"source\"}}, "
                                  f"got {_short(repr(data))}")
    return {str(dt): _real(e, f"{where}.{dt}") for dt, e in data.items()}


def _accelerator(data: Any, where: str) -> Accelerator:
    """The accelerator of a preset named by ``data``, or built from the numbers in ``data``."""
    if isinstance(data, str):
        if data not in preset_names():
            raise InvalidClusterError(f"{where}: {_short(data)!r} is not a preset; give one of "
                                      f"{', '.join(preset_names())}, or the accelerator's numbers")
        return _accelerator(preset_data(data)["accelerator"], f"{where} (preset {data!r})")
    data = _keys(data, "accelerator", where)
    per_dtype = {key: _per_dtype(data.get(key, {}), f"{where}.{key}") for key in ("peak_flops", "matmul_efficiency")}
    numbers = {key: _real(data.get(key), f"{where}.{key}") for key in _ACCEL_NUMBERS}
    counts = {key: _count(data.get(key), f"{where}.{key}") for key in _ACCEL_COUNTS}
    extra = {}
    if "attention_by_seq_len" in data:
        extra["attention_by_seq_len"] = _pairs(data["attention_by_seq_len"], f"{where}.attention_by_seq_len")
    if "cudnn_attention_by_seq_len" in data:
        extra["cudnn_attention_by_seq_len"] = _pairs(data["cudnn_attention_by_seq_len"],
                                                     f"{where}.cudnn_attention_by_seq_len", width=3)
    if "cudnn_window_attention" in data:
        extra["cudnn_window_attention"] = _pairs(data["cudnn_window_attention"], f"{where}.cudnn_window_attention",
                                                 width=4)
    if "flops_per_exp" in data:
        extra["flops_per_exp"] = _real(data["flops_per_exp"], f"{where}.flops_per_exp")
    if "host_link_Bps" in data:
        extra["host_link_Bps"] = _real(data["host_link_Bps"], f"{where}.host_link_Bps")
    if "host_memory_bytes" in data:
        extra["host_memory_bytes"] = _real(data["host_memory_bytes"], f"{where}.host_memory_bytes")
    if "ordered_comm_overlap" in data:
        flag = _value(data["ordered_comm_overlap"], f"{where}.ordered_comm_overlap")
        if not isinstance(flag, bool):
            raise InvalidClusterError(f"{where}.ordered_comm_overlap: value must be true or false, "
                                      f"got {_short(repr(flag))}")
        extra["ordered_comm_overlap"] = flag
    if "calibration" in data:
        extra["calibration"] = _real(data["calibration"], f"{where}.calibration")
    return Accelerator(name=str(data.get("name", "?")), **per_dtype, **numbers, **counts, **extra)


def _pairs(entry: Any, where: str, width: int = 2) -> tuple[tuple[float, ...], ...]:
    """A ``{"value": [[x, y], ...], "source"}`` entry's pairs (``width`` 3: triples) of finite numbers (at most 64)."""
    value = _value(entry, where)
    ok = isinstance(value, list) and 0 < len(value) <= 64 and all(
        isinstance(p, list) and len(p) == width and all(not isinstance(x, bool) and isinstance(x, (int, float))
                                                        and math.isfinite(x) for x in p) for p in value)
    if not ok:
        shape = ", ".join(["number"] * width)
        kind = {2: "pairs", 3: "triples"}.get(width, f"{width}-tuples")
        raise InvalidClusterError(f"{where}: value must be a list of 1 to 64 [{shape}] {kind}, "
                                  f"got {_short(repr(value))}")
    return tuple(tuple(float(x) for x in p) for p in value)


def _domain(entry: Any, where: str, gpus_per_node: int, world: int) -> int:
    value = _value(entry, where)
    if value == "node":
        return gpus_per_node
    if value == "world":
        return world
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS:
        raise InvalidClusterError(f"{where}: domain_size must be a whole number of GPUs from 1 to {MAX_GPUS}, "
                                  f"\"node\" or \"world\", got {_short(repr(value))}")
    if value % gpus_per_node:
        raise InvalidClusterError(f"{where}: a domain of {value} GPUs does not split into nodes of "
                                  f"{gpus_per_node} ({value} % {gpus_per_node} = {value % gpus_per_node}); "
                                  f"use gpus_per_node dividing {value}")
    return min(value, world)


def _bandwidth(t: dict[str, Any], at: str, gpus_per_node: int) -> float:
    """Per-GPU bandwidth of a tier: given, or the node's links shared by its GPUs; over the oversubscription."""
    links = [k for k in ("links_per_node", "link_Gbps") if k in t]
    if ("bandwidth_Bps" in t) == bool(links) or len(links) == 1:
        raise InvalidClusterError(f"{at}: give the bandwidth either as bandwidth_Bps (per GPU and direction) or as "
                                  f"links_per_node and link_Gbps (per link and direction), not "
                                  f"{sorted(k for k in t if k in ('bandwidth_Bps', *links)) or 'neither'}")
    if "bandwidth_Bps" in t:
        field, per_gpu = "bandwidth_Bps", _real(t["bandwidth_Bps"], f"{at}.bandwidth_Bps")
    else:
        field = "link_Gbps"
        per_gpu = (_count(t["links_per_node"], f"{at}.links_per_node") * _real(t["link_Gbps"], f"{at}.link_Gbps")
                   * 1e9 / 8 / gpus_per_node)
    if per_gpu <= 0:  # here, where the file's field can be named, not later in Tier's own check
        raise InvalidClusterError(f"{at}.{field}: value must be a number > 0 (a tier that moves no bytes carries no "
                                  f"collective), got {t[field]['value']!r}")
    if "oversubscription" in t:
        ratio = _real(t["oversubscription"], f"{at}.oversubscription")
        if ratio < 1:
            raise InvalidClusterError(f"{at}.oversubscription: value must be >= 1 (2 for a 2:1 fat tree), got {ratio!r}")
        per_gpu /= ratio
    return per_gpu


def _tiers(data: Any, where: str, gpus_per_node: int, world: int) -> tuple[Tier, ...]:
    if not isinstance(data, list) or not data:
        raise InvalidClusterError(f"{where}.tiers: expected a non-empty list of tiers, inner to outer, "
                                  f"got {_short(repr(data))}")
    tiers = []
    for i, t in enumerate(data):
        at = f"{where}.tiers[{i}]"
        t = _keys(t, "tier", at)
        tiers.append(Tier(name=str(t.get("name", f"tier{i}")), kind=t.get("kind"),
                          domain_size=_domain(t.get("domain_size"), f"{at}.domain_size", gpus_per_node, world),
                          bandwidth_Bps=_bandwidth(t, at, gpus_per_node),
                          latency_s=_real(t.get("latency_s"), f"{at}.latency_s")))
    return tuple(tiers)


def _check_shape(name: str, nodes: Any, gpus: Any, max_gpus: int | None) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise InvalidClusterError(f"cluster {name!r}: nodes must be at least 1, got {nodes!r} "
                                  f"(expected form {SPEC_FORM})")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InvalidClusterError(f"cluster {name!r}: gpus_per_node must be at least 1, got {gpus!r} "
                                  f"(expected form {SPEC_FORM})")
    if nodes * gpus > MAX_GPUS:
        raise InvalidClusterError(f"cluster {name!r}: nodes({nodes}) * gpus_per_node({gpus}) = {nodes * gpus} GPUs "
                                  f"exceeds the limit of {MAX_GPUS} (10^7, ir/limits.MAX_GPUS) meshplan plans for; "
                                  "check the node count for a typo")
    if max_gpus is not None and gpus > max_gpus:
        total = nodes * gpus
        hint = f"; for {total} GPUs use {name}:{total // max_gpus}x{max_gpus}" if total % max_gpus == 0 else ""
        raise InvalidClusterError(f"cluster {name!r}: a node holds at most {max_gpus} GPUs, "
                                  f"got gpus_per_node={gpus}{hint}")


def cluster_from_dict(data: Any, *, nodes: int | None = None, gpus_per_node: int | None = None, spec: str = "",
                      where: str | None = None) -> Cluster:
    """A cluster from preset or cluster-file data (schema ``meshplan.cluster/1``); ``nodes`` and
    ``gpus_per_node``, where given, replace the file's (``nodes`` defaults to the file's, else 1)."""
    name = str(data.get("name", "custom")) if isinstance(data, dict) else "custom"
    where = where or f"cluster {name!r}"
    data = _keys(data, "cluster", where)
    if data.get("schema") != SCHEMA:
        raise InvalidClusterError(f"{where}: schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    if gpus_per_node is None:
        gpus_per_node = _count(data.get("gpus_per_node"), f"{where}.gpus_per_node")
    if nodes is None:
        nodes = _count(data["nodes"], f"{where}.nodes") if "nodes" in data else 1
    max_entry = data.get("max_gpus_per_node")
    max_gpus = None if max_entry is None else _count(max_entry, f"{where}.max_gpus_per_node")
    _check_shape(name, nodes, gpus_per_node, max_gpus)
    accel = _accelerator(data.get("accelerator"), f"{where}.accelerator")
    tiers = _tiers(data.get("tiers"), where, gpus_per_node, nodes * gpus_per_node)
    return Cluster(accelerator=accel, nodes=nodes, gpus_per_node=gpus_per_node, tiers=tiers, name=name, spec=spec)
