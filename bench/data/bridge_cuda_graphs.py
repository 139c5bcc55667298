"""The ``cuda_graphs`` cells of reference_runs.csv: what each Megatron-Bridge MoE row's workload config captures in
CUDA graphs, read from its release's Megatron-Bridge tag.

    python bench/data/bridge_cuda_graphs.py PATH   # PATH: a clone of github.com/NVIDIA-NeMo/Megatron-Bridge (or
                                                   # its bare git directory) with its release tags

For every Megatron-Bridge row of DeepSeek-V3, GPT-OSS 120B, Qwen3 and Kimi K2 whose release has a tag (26.02
@v0.3.0, 26.02.01 @v0.3.1, 26.04 @v0.4.0, 26.04.01 @v0.4.1, 26.06 @v0.5.0, 26.06.01 @v0.5.1), the workload configs
of ``scripts/performance/configs/<family>/*_workload_base_configs.py`` at that tag (``WorkloadBaseConfig`` from
``scripts/performance/utils/utils.py``, run as they are: plain dataclasses) named for the row's GPU and precision
are matched on the layout the row publishes (tp, pp, vp, ep, micro-batch, GPUs). Where the matches agree, it prints
the row's line and cell: ``none`` (``cuda_graph_impl`` unset), ``full_iteration``, or ``transformer_engine:`` with
its ``cuda_graph_scope`` joined by ``+``; where none or several disagreeing configs match, an empty cell. Data
tooling, not part of the package: it runs the configs' own Python, so point it at a clone you trust.
"""
from __future__ import annotations

import csv
import re
import subprocess
import sys
import types
from pathlib import Path

CSV = Path(__file__).resolve().parent / "reference_runs.csv"
TAGS = {"26.02": "v0.3.0", "26.02.01": "v0.3.1", "26.04": "v0.4.0", "26.04.01": "v0.4.1", "26.06": "v0.5.0",
        "26.06.01": "v0.5.1"}
# model-name word -> (config file under scripts/performance/configs, the size in its config names)
FAMILIES = {"deepseek": ("deepseek/deepseek_workload_base_configs.py", "V3"),
            "gpt oss": ("gpt_oss/gpt_oss_workload_base_configs.py", "120B"),
            "qwen3_235b": ("qwen/qwen3_workload_base_configs.py", "235B"),
            "qwen3_30b": ("qwen/qwen3_workload_base_configs.py", "30B"),
            "kimi": ("kimi/kimi_workload_base_configs.py", "K2")}
PRECISIONS = {"MXFP8": "FP8_MX", "FP8-MX": "FP8_MX", "FP8": "FP8_CS", "FP8-CS": "FP8_CS", "BF16": "BF16",
              "NVFP4": "NVFP4"}


def _show(git_dir: str, tag: str, path: str) -> str:
    # git -C: a clone's work tree or a bare git directory alike (--git-dir would need a clone's .git)
    return subprocess.run(["git", "-C", git_dir, "show", f"{tag}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def _configs(git_dir: str, tag: str, path: str) -> dict[str, object]:
    """The module namespace of one workload-config file at ``tag``, with its ``utils.utils`` from the same tag."""
    utils = types.ModuleType("utils.utils")
    package = types.ModuleType("utils")
    package.__path__ = []
    sys.modules["utils"], sys.modules["utils.utils"] = package, utils
    exec(compile(_show(git_dir, tag, "scripts/performance/utils/utils.py"), "utils.py", "exec"), utils.__dict__)
    namespace: dict[str, object] = {}
    exec(compile(_show(git_dir, tag, f"scripts/performance/configs/{path}"), path, "exec"), namespace)
    return namespace


def cell(impl: str | None, scope: object) -> str:
    """The CSV cell of a config's ``cuda_graph_impl`` and ``cuda_graph_scope``."""
    if impl in (None, "none"):
        return "none"
    if impl == "full_iteration":
        return "full_iteration"
    scopes = list(scope) if isinstance(scope, (list, tuple)) else []
    return f"{impl}:{'+'.join(scopes)}" if scopes else str(impl)


def _int(text: str, default: int | None) -> int | None:
    return int(text) if text.strip() else default


def row_cell(row: dict[str, str], git_dir: str, cache: dict) -> str:
    """The ``cuda_graphs`` cell of one CSV row ("" where its release has no tag or no single config matches)."""
    found = re.search(r"\((\S+) (\S+), ([\d.]+)[,)]", row["model"])
    key = next((k for k in FAMILIES if k in row["model"].lower()), None)
    if "Megatron-Bridge" not in row["source"] or not found or key is None or found.group(3) not in TAGS:
        return ""
    gpu, precision, tag = found.group(1), PRECISIONS.get(found.group(2)), TAGS[found.group(3)]
    path, size = FAMILIES[key]
    if (tag, path) not in cache:
        cache[tag, path] = _configs(git_dir, tag, path)
    vp = _int(row["vp"], 1)
    layout = (_int(row["tp"], 1), _int(row["pp"], 1), vp if vp and vp > 1 else None, _int(row["ep"], 1),
              _int(row["micro_batch"], 1), int(row["gpus"]))
    cells = set()
    for name, config in cache[tag, path].items():
        if not re.search(rf"_{size}_.*PRETRAIN_CONFIG_{gpu}_{precision}_V\d+$", name.upper()):
            continue
        if (key.startswith("qwen3") and "NEXT" in name.upper()) or not hasattr(config, "micro_batch_size"):
            continue
        if (config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
                config.virtual_pipeline_model_parallel_size or None, config.expert_model_parallel_size,
                config.micro_batch_size, config.num_gpus) == layout:
            cells.add(cell(config.cuda_graph_impl, config.cuda_graph_scope))
    return cells.pop() if len(cells) == 1 else ""


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    cache: dict = {}
    with CSV.open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            found = row_cell(row, argv[0], cache)
            if found:
                print(f"line {line}: {row['model']}: {found}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
