"""A checkpoint's manifest: the size and CRC-32 of every file DCP wrote, so that a load can tell a
checkpoint that is whole from one with a flipped byte, a truncated shard or an empty ``.metadata``.

DCP itself records no checksum: a damaged tensor payload loads silently (and may train into
``loss nan``), a damaged ``.metadata`` ends in an ``EOFError`` on every rank. So after ``dcp.save``
returns on every rank (its coordinator writes ``.metadata`` before any rank returns), the ranks
digest the directory's files between them (file i on rank ``i mod world``), rank 0 writes
``meshplan-manifest.json`` to a temporary name, flushes it to disk and renames it into place. The
rename is atomic, so a directory with a manifest that parses is a checkpoint every rank finished;
one without is incomplete.

Verifying reads every byte once, split over the ranks the same way, and every rank gets the same
verdict (an ``all_gather_object``), so that all of them fall back together or load together.
CRC-32 (``zlib``, several GB/s) guards against damage, not against an adversary.
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import torch.distributed as dist

MANIFEST_FILE = "meshplan-manifest.json"
FORMAT = 1
CHUNK_BYTES = 16 << 20


def digest(path: Path) -> dict[str, int]:
    """``{"size_bytes", "crc32"}`` of one file, read in chunks."""
    crc, size = 0, 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return {"size_bytes": size, "crc32": crc}


def write_manifest(path: str | os.PathLike, *, step: int) -> None:
    """Digest every file under the checkpoint directory ``path`` and write the manifest (rank 0, last,
    atomically). A collective: call it on every rank once ``dcp.save`` has returned."""
    root = Path(path)
    names = sorted(p.name for p in root.iterdir() if p.is_file() and not p.name.startswith(MANIFEST_FILE))
    mine = {name: digest(root / name) for name in _share(names)}
    files = {name: entry for part in _gather(mine) for name, entry in part.items()}
    if _rank() == 0:
        manifest = {"format": FORMAT, "step": step, "files": {name: files[name] for name in names}}
        partial = root / f"{MANIFEST_FILE}.partial"
        with partial.open("w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        partial.replace(root / MANIFEST_FILE)
    if dist.is_initialized():
        dist.barrier()  # no rank returns (and renames or prunes) before the manifest is there


def read_manifest(path: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of the checkpoint directory ``path``, or None if it has none that is valid."""
    try:
        manifest = json.loads((Path(path) / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        return None
    return manifest


def verify(path: str | os.PathLike, manifest: dict[str, Any]) -> list[str]:
    """Every problem with the files ``manifest`` lists (missing, unreadable, other size, other CRC-32),
    in file order, the same list on every rank. A collective."""
    root = Path(path)
    names = sorted(manifest["files"])
    mine = {name: _problem(root / name, manifest["files"][name]) for name in _share(names)}
    found = {name: problem for part in _gather(mine) for name, problem in part.items()}
    return [found[name] for name in names if found[name]]


def _problem(path: Path, expect: dict[str, int]) -> str:
    try:
        got = digest(path)
    except FileNotFoundError:
        return f"'{path.name}' is missing"
    except OSError as exc:
        return f"'{path.name}' cannot be read ({exc.strerror})"
    if got["size_bytes"] != expect["size_bytes"]:
        return f"'{path.name}' has {got['size_bytes']} bytes but {expect['size_bytes']} were written"
    if got["crc32"] != expect["crc32"]:
        return f"'{path.name}' has CRC-32 {got['crc32']:08x} but {expect['crc32']:08x} was written"
    return ""


def _share(names: list[str]) -> list[str]:
    """This rank's files: every world-th one."""
    if not dist.is_initialized():
        return names
    return names[dist.get_rank()::dist.get_world_size()]


def _gather(mine: dict[str, Any]) -> list[dict[str, Any]]:
    if not dist.is_initialized():
        return [mine]
    parts: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return parts  # type: ignore[return-value]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
