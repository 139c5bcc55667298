"""Cluster presets: data files ``presets/<name>.json`` and the ``NAME:NODESxGPUS`` spec.

Every number in a preset is ``{"value": ..., "source": "..."}``: where it comes from (a datasheet,
a paper, a measurement) or, for a placeholder, that it is one. ``meshplan calibrate`` writes its raw
timings instead (schema ``meshplan.profile/1``, read by ``profile.py``); ``parse_cluster`` takes
either a preset spec or the path of such a profile.
A tier's ``domain_size`` is a number of ranks, ``"node"`` (= gpus_per_node) or ``"world"``.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from ..ir.errors import InvalidClusterError
from .hardware import Accelerator, Cluster, Tier

SCHEMA = "meshplan.cluster/1"
SPEC_FORM = "NAME:NODESxGPUS, e.g. h100-sxm:16x8, or a profile PATH.json from `meshplan calibrate`"
_SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)(?::(-?\d+)x(-?\d+))?$")
_ACCEL_NUMBERS = ("memory_bytes", "reserved_bytes", "memory_bw_Bps", "memory_efficiency", "attention_efficiency",
                  "kernel_overhead_s")


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


def parse_cluster(spec: str) -> Cluster:
    """``"h100-sxm:16x8"`` -> 16 nodes of 8 H100s; a plain ``"h100-sxm"`` is one node; a path ending in
    ``.json`` is a profile written by ``meshplan calibrate`` (``profile.py``)."""
    if isinstance(spec, str) and spec.strip().endswith(".json"):
        from .profile import cluster_from_profile

        return cluster_from_profile(spec.strip())
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if match is None:
        raise InvalidClusterError(f"cluster spec {spec!r} is not of the form {SPEC_FORM}")
    name, nodes, gpus = match.groups()
    if nodes is None:
        return load_preset(name)
    return load_preset(name, nodes=int(nodes), gpus_per_node=int(gpus))


def _number(entry: Any, where: str) -> Any:
    if not isinstance(entry, dict) or "value" not in entry:
        raise InvalidClusterError(f"{where}: expected {{\"value\": ..., \"source\": \"...\"}}, got {entry!r}")
    if not isinstance(entry.get("source"), str) or not entry["source"].strip():
        raise InvalidClusterError(f"{where}: every number needs a non-empty \"source\"")
    return entry["value"]


def _accelerator(data: dict[str, Any], where: str) -> Accelerator:
    per_dtype = {key: {dt: float(_number(e, f"{where}.{key}.{dt}")) for dt, e in data.get(key, {}).items()}
                 for key in ("peak_flops", "matmul_efficiency")}
    numbers = {key: float(_number(data.get(key), f"{where}.{key}")) for key in _ACCEL_NUMBERS}
    counts = {key: int(_number(data.get(key), f"{where}.{key}")) for key in ("compute_units", "matmul_tile_elems")}
    return Accelerator(name=str(data.get("name", "?")), **per_dtype, **numbers, **counts)


def _domain(value: Any, where: str, gpus_per_node: int, world: int) -> int:
    if value == "node":
        return gpus_per_node
    if value == "world":
        return world
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidClusterError(f"{where}: domain_size must be a positive integer, \"node\" or \"world\", "
                                  f"got {value!r}")
    if value % gpus_per_node:
        raise InvalidClusterError(f"{where}: a domain of {value} GPUs does not split into nodes of "
                                  f"{gpus_per_node} ({value} % {gpus_per_node} = {value % gpus_per_node}); "
                                  f"use gpus_per_node dividing {value}")
    return min(value, world)


def _tiers(data: list[Any], where: str, gpus_per_node: int, world: int) -> tuple[Tier, ...]:
    tiers = []
    for i, t in enumerate(data):
        at = f"{where}.tiers[{i}]"
        tiers.append(Tier(name=str(t.get("name", f"tier{i}")), kind=t.get("kind"),
                          domain_size=_domain(_number(t.get("domain_size"), f"{at}.domain_size"), at,
                                              gpus_per_node, world),
                          bandwidth_Bps=float(_number(t.get("bandwidth_Bps"), f"{at}.bandwidth_Bps")),
                          latency_s=float(_number(t.get("latency_s"), f"{at}.latency_s"))))
    return tuple(tiers)


def _check_shape(name: str, nodes: Any, gpus: Any, max_gpus: int | None) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise InvalidClusterError(f"cluster {name!r}: nodes must be at least 1, got {nodes!r} "
                                  f"(expected form {SPEC_FORM})")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InvalidClusterError(f"cluster {name!r}: gpus_per_node must be at least 1, got {gpus!r} "
                                  f"(expected form {SPEC_FORM})")
    if max_gpus is not None and gpus > max_gpus:
        total = nodes * gpus
        hint = f"; for {total} GPUs use {name}:{total // max_gpus}x{max_gpus}" if total % max_gpus == 0 else ""
        raise InvalidClusterError(f"cluster {name!r}: a node holds at most {max_gpus} GPUs, "
                                  f"got gpus_per_node={gpus}{hint}")


def cluster_from_dict(data: dict[str, Any], *, nodes: int = 1, gpus_per_node: int | None = None) -> Cluster:
    """A cluster from preset/calibration data (schema ``meshplan.cluster/1``)."""
    name = str(data.get("name", "custom"))
    if data.get("schema") != SCHEMA:
        raise InvalidClusterError(f"cluster {name!r}: schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    gpus = _number(data.get("gpus_per_node"), f"{name}.gpus_per_node") if gpus_per_node is None else gpus_per_node
    max_entry = data.get("max_gpus_per_node")
    max_gpus = None if max_entry is None else int(_number(max_entry, f"{name}.max_gpus_per_node"))
    _check_shape(name, nodes, gpus, max_gpus)
    accel = _accelerator(data.get("accelerator", {}), f"{name}.accelerator")
    tiers = _tiers(data.get("tiers", []), name, gpus, nodes * gpus)
    return Cluster(accelerator=accel, nodes=nodes, gpus_per_node=gpus, tiers=tiers, name=name)
