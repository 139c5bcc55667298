"""Imports flow one way (DESIGN.md's table): parse every module and check each import."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> meshplan packages and third-party modules it may import (stdlib always allowed).
# zoo also takes ir for the one error family (UnknownModelError is a PlanError). The runtime imports
# transformers only to rebuild a plan's Hugging Face model from its source (runtime/source.py, lazily), and
# safetensors (transformers' own dependency, which torch's HuggingFaceStorageReader reads with too) to read experts
# stored one by one from a Hugging Face checkpoint (runtime/pretrained.py, lazily).
ALLOWED = {
    "ir": ({"ir"}, {"sympy", "pydantic", "pydantic_core"}),
    "frontend": ({"ir", "frontend"}, {"torch", "sympy"}),
    "cost_model": ({"ir", "cost_model"}, set()),
    "solver": ({"ir", "cost_model", "solver"}, {"ortools", "networkx", "sympy"}),
    "codegen": ({"ir", "codegen"}, {"triton", "sympy"}),
    "runtime": ({"ir", "codegen", "runtime"}, {"torch", "transformers", "safetensors"}),
    "zoo": ({"zoo", "ir"}, {"torch"}),
    "export": ({"ir", "export"}, set()),
}


def _imports(path: Path, package: str) -> list[tuple[str, int]]:
    """(top-level name, line) of every import; meshplan-internal ones as 'meshplan.<pkg>'."""
    tree = ast.parse(path.read_text(), filename=str(path))
    depth = len(path.relative_to(ROOT).parts) - 1  # folders below the package root
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                out.append((node.module or "", node.lineno))
                continue
            parts = list(path.relative_to(ROOT).parts[:-1])[: depth - node.level + 1]
            target = ".".join(["meshplan", *parts, *(node.module.split(".") if node.module else [])])
            if node.module is None:  # from . import x
                out += [(f"{target}.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((target, node.lineno))
    return out


def _violations(package: str) -> list[str]:
    internal, third_party = ALLOWED[package]
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name, line in _imports(path, package):
            top = name.split(".")[0]
            if top == "meshplan":
                sub = name.split(".")[1] if name.count(".") else ""
                if sub not in internal:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
            elif top and top not in sys.stdlib_module_names and top not in third_party and top != "__future__":
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_flow_one_way(package: str) -> None:
    assert _violations(package) == []


def test_checker_catches_a_wrong_way_import(tmp_path, monkeypatch) -> None:
    fake_root = tmp_path
    (fake_root / "ir").mkdir()
    (fake_root / "ir" / "bad.py").write_text("from ..runtime import apply\nimport torch\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    assert _violations("ir") == ["ir/bad.py:1 imports meshplan.runtime", "ir/bad.py:2 imports torch"]
