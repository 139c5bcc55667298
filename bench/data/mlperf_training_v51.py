"""The MLPerf Training v5.1 rows of reference_runs.csv: each one's measured step time, from its result logs.

    python bench/data/mlperf_training_v51.py PATH   # PATH: a clone of github.com/mlcommons/training_results_v5.1
                                                   # (or its bare git directory; read at HEAD)

Prints, for every submission in ``ROWS`` (the ones whose launch configuration is unambiguous: named by the
submitter's README, or the only configuration of its implementation directory with that system's node count and
global batch), the median ``train_step_time`` over every ``tracked_stats`` record of all its ``result_*.txt`` logs,
the global batch the log states, and tokens/s per GPU = global batch x 8192 / median step / GPUs: the
``measured_tokens_per_s_per_gpu`` of its CSV row. The plan columns of each row come from the configuration named
here (``config_*.sh``: TENSOR/PIPELINE/CONTEXT_PARALLEL, INTERLEAVED_PIPELINE, MICRO_BATCH_SIZE, MINIBS, FP8 or
FP4). Data tooling, not part of the package.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

SEQ = 8192
# (org, system dir, benchmark, GPUs, config the row's plan is read from)
ROWS = [
    ("NVIDIA", "tyche_ngpu8_ngc25.09_nemo", "llama31_8b", 8, "config_GB200_2x4x2xtp1pp1cp1_8b_fp4.sh"),
    ("NVIDIA", "tyche_ngpu72_ngc25.09_nemo", "llama31_8b", 72, "config_GB200_18x4x1xtp1pp1cp2_8b.sh"),
    ("NVIDIA", "tyche_ngpu512_ngc25.09_nemo", "llama31_8b", 512, "config_GB200_128x4x1xtp2pp1cp4_8b.sh"),
    ("NVIDIA", "theia_ngpu8_ngc25.09_nemo", "llama31_8b", 8, "config_GB300_2x4x2xtp1pp1cp1_8b_fp4.sh"),
    ("NVIDIA", "theia_ngpu72_ngc25.09_nemo", "llama31_8b", 72, "config_GB300_18x4x1xtp1pp1cp2_8b.sh"),
    ("NVIDIA", "theia_ngpu512_ngc25.09_nemo", "llama31_8b", 512, "config_GB300_128x4x1xtp2pp1cp4_8b.sh"),
    ("NVIDIA", "tyche_ngpu512_ngc25.09_nemo", "llama31_405b", 512, "config_GB200_128x4x144xtp4pp8cp2_cg_fp4.sh"),
    ("NVIDIA", "theia_ngpu512_ngc25.09_nemo", "llama31_405b", 512, "config_GB300_128x4x72xtp2pp8cp2_cg_fp4.sh"),
    ("NVIDIA", "hsg_ngpu2560_ngc25.09_nemo", "llama31_405b", 2560, "config_GB200_640x4x24xtp4pp8cp2_cg_fp4.sh"),
    ("NVIDIA", "hsg_ngpu5120_ngc25.09_nemo", "llama31_405b", 5120, "config_GB200_1280x4x16xtp4pp8cp2_cg_fp4.sh"),
    ("Nebius", "nebius_h200_n64", "llama31_405b", 512, "config_DGXH200_64x8x144xtp4pp8cp2.sh"),
    ("Nebius", "nebius_h200_n128", "llama31_405b", 1024, "config_DGXH200_128x8x72xtp4pp8cp2.sh"),
    ("Cisco", "hpf_n8", "llama31_8b", 64, "config_DGXH100_8x8x1xtp1pp1cp1.sh"),
    ("Cisco", "hpf_n16", "llama31_8b", 128, "config_DGXH100_16x8x1xtp2pp1cp1.sh"),
    ("HPE", "HPE-Cray-XD670-H200-SXM5-141GB_n8_25.09", "llama31_8b", 64, "config_XD670_8x8x1xtp1pp1cp2_8b.sh"),
    ("University-of-Florida", "hpg.dgxb200x8.n1", "llama31_8b", 8, "config_DGXB200_1x8x2xtp1pp1cp1_8b.sh"),
    ("University-of-Florida", "hpg.dgxb200x8.n2", "llama31_8b", 16, "config_DGXB200_2x8x2xtp1pp1cp1_8b.sh"),
    ("University-of-Florida", "hpg.dgxb200x8.n4", "llama31_8b", 32, "config_DGXB200_4x8x1xtp1pp1cp2_8b.sh"),
    ("University-of-Florida", "hpg.dgxb200x8.n8", "llama31_8b", 64, "config_DGXB200_8x8x1xtp1pp1cp2_8b.sh"),
    ("University-of-Florida", "hpg.dgxb200x8.n16", "llama31_8b", 128, "config_DGXB200_16x8x1xtp1pp1cp2_8b.sh"),
    ("University-of-Florida", "hpg.dgxb200x8.n32", "llama31_8b", 256, "config_DGXB200_32x8x1xtp1pp1cp2_8b.sh"),
    ("University-of-Florida", "hpg.dgxb200x8.n32", "llama31_405b", 256, "config_DGXB200_32x8x144xtp4pp8cp2_cg.sh"),
    ("University-of-Florida", "hpg.dgxb200x8.n56", "llama31_405b", 448, "config_DGXB200_56x8x144xtp4pp8cp2_cg.sh"),
    ("Verda", "b200_8x8_ngc25.09", "llama31_8b", 64, "config_DGXB200_8x8x1xtp1pp1cp2_8b.sh"),
    ("Dell", "1xXE9680Lx8B200-SXM-180GB", "llama31_8b", 8, "config_1xXE9680Lx8B200-SXM-180GB.sh"),
    ("Dell", "2xXE9680Lx8B200-SXM-180GB", "llama31_8b", 16, "config_2xXE9680Lx8B200-SXM-180GB_2x8x2xtp1pp1cp1_8b.sh"),
    ("Dell", "2xXE9685Lx8B200-SXM-180GB", "llama31_8b", 16, "config_XE9685Lx8B200-SXM-180GB_2x8x2xtp1pp1cp1.sh"),
    ("Dell", "1xXE9780x8B300-SXM-270GB", "llama31_8b", 8, "config_XE9780x8B300-SXM-270GB_1x8x2xtp1pp1cp1_8b.sh"),
]


def reader(root: Path):
    """A function from a path in the repository to its text: files of a clone, or HEAD of a bare git directory."""
    if (root / "HEAD").is_file() and not (root / ".git").exists():
        return lambda rel: subprocess.run(["git", f"--git-dir={root}", "show", f"HEAD:{rel}"],
                                          capture_output=True, text=True, check=True).stdout
    return lambda rel: (root / rel).read_text()


def measure(read, org: str, system: str, bench: str) -> tuple[float, int, int, int]:
    """(median step s, global batch, step records, logs) of one submission's result logs."""
    steps, gbs, logs = [], None, 0
    for i in range(10):
        try:
            text = read(f"{org}/results/{system}/{bench}/result_{i}.txt")
        except (OSError, subprocess.CalledProcessError):
            continue
        logs += 1
        for line in text.splitlines():
            if ":::MLLOG" not in line:
                continue
            rec = json.loads(line.split(":::MLLOG", 1)[1])
            value = rec["value"]
            if rec["key"] == "tracked_stats" and isinstance(value, dict) and "train_step_time" in value:
                steps.append(value["train_step_time"])
            elif rec["key"] == "global_batch_size":
                gbs = int(value)
    return statistics.median(steps), gbs, len(steps), logs


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    read = reader(Path(argv[0]))
    for org, system, bench, gpus, config in ROWS:
        step, gbs, n, logs = measure(read, org, system, bench)
        print(f"{org}/{system}/{bench}: {config}; {logs} logs, {n} steps, median {step:.4f} s, global batch {gbs}, "
              f"{gbs * SEQ / step / gpus:.0f} tokens/s/GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
