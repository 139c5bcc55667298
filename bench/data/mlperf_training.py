"""The MLPerf Training rows of reference_runs.csv: each one's measured step time, from its result logs.

    python bench/data/mlperf_training.py ROUND PATH   # ROUND: v3.0, v3.1, v4.0, v4.1, v5.0 or v5.1; PATH: a clone of
                                                     # github.com/mlcommons/training_results_ROUND (or its bare git
                                                     # directory; read at HEAD)

Prints, for every submission in ``ROWS`` (the ones whose launch configuration is unambiguous: named by the
submitter's README, or the only configuration of its implementation directory with that system's node count and
global batch), the median ``train_step_time`` over every ``tracked_stats`` record of all its ``result_*.txt`` logs,
the global batch and sequence length the log states, and tokens/s per GPU = global batch x sequence / median step /
GPUs: the ``measured_tokens_per_s_per_gpu`` of its CSV row. Logs that record no step time (v4.0's) give it by their
training blocks instead: each ``block_stop`` less its ``block_start`` (the training between two evaluations; the
evaluation runs outside them) over the steps in the block (its ``epoch_count``, in tokens, over global batch x
sequence), the median over every block of every log. AMD's implementation logs a ``throughput`` in samples per
second instead (its callbacks.py: the global batches of the train batches since the last record over their time):
its step time is the global batch over it. The plan columns of each row come from the configuration
named here (``config_*.sh``: TENSOR/PIPELINE/CONTEXT_PARALLEL, INTERLEAVED_PIPELINE, MICRO_BATCH_SIZE, MINIBS, FP8
or FP4). Data tooling, not part of the package.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

# round -> (org, system dir, benchmark, GPUs, config the row's plan is read from)
ROWS = {
    # training_results_v3.0 @63e326c: GPT-3 175B on H100, NVIDIA's DGX and CoreWeave's HGX (the configuration of each
    # submission is the only one of its implementation directory with its node count)
    "v3.0": [
        ("NVIDIA", "dgxh100_n64_nemo", "gpt3", 512, "config_DGXH100_64x8x128x4x8_mbs1.sh"),
        ("NVIDIA", "dgxh100_n96_nemo", "gpt3", 768, "config_DGXH100_96x8x128x4x8_mbs1.sh"),
        ("NVIDIA_CoreWeave", "coreweave_hgxh100_n96_ngc23.04_pytorch", "gpt3", 768,
         "config_DGXH100_96x8x128x4x8_mbs1.sh"),
        ("NVIDIA_CoreWeave", "coreweave_hgxh100_n192_ngc23.04_pytorch", "gpt3", 1536,
         "config_DGXH100_192x8x64x4x8_mbs1.sh"),
        ("NVIDIA_CoreWeave", "coreweave_hgxh100_n448_ngc23.04_pytorch", "gpt3", 3584,
         "config_DGXH100_448x8x24x4x8_mbs1.sh"),
    ],
    # training_results_v3.1 @d06288b: GPT-3 175B on H100, NVIDIA's Eos and Azure's ND H100 v5 (the configuration of
    # each submission is the only one of its implementation directory with its node count and global batch; Eos's
    # 64-node submission matches none there and is left out)
    "v3.1": [
        ("NVIDIA", "eos_n96_ngc23.09_nemo", "gpt3", 768, "config_DGXH100_96x8x128x4x8_mbs1.sh"),
        ("NVIDIA", "eos-dfw_n512_ngc23.09_nemo", "gpt3", 4096, "config_DGXH100_512x8x16x4x8_mbs1.sh"),
        ("NVIDIA", "eos-dfw_n768_ngc23.09_nemo", "gpt3", 6144, "config_DGXH100_768x8x16x4x8_mbs1.sh"),
        ("NVIDIA", "eos-dfw_n1024_ngc23.09_nemo", "gpt3", 8192, "config_DGXH100_1024x8x16x4x8_mbs1.sh"),
        ("NVIDIA", "eos-dfw_n1280_ngc23.09_nemo", "gpt3", 10240, "config_DGXH100_1280x8x8x4x8_mbs1.sh"),
        ("NVIDIA", "eos-dfw_n1344_ngc23.09_nemo", "gpt3", 10752, "config_DGXH100_1344x8x8x4x8_mbs1.sh"),
        ("Azure+NVIDIA", "ND_H100_v5_n1344_pytorch", "gpt3", 10752, "config_DGXH100_1344x8x8x4x8_mbs1.sh"),
    ],
    # training_results_v4.0 @6fe9543: GPT-3 175B (NVIDIA's NeMo implementation; configs named by each submission's
    # README); its logs record no step time, so the steps are timed by training blocks (module docstring)
    "v4.0": [
        ("NVIDIA", "eos_n64_ngc24.04_nemo", "gpt3", 512, "config_DGXH100_64x8x128x4x8_mbs2.sh"),
        ("NVIDIA", "eos-dfw_n1344_ngc24.04_nemo", "gpt3", 10752, "config_DGXH100_1344x8x6x4x6_mbs1_cg.sh"),
        ("NVIDIA", "eos-dfw_n1452_ngc24.04_nemo", "gpt3", 11616, "config_DGXH100_1452x8x6x4x6_mbs1_cg.sh"),
    ],
    # training_results_v4.1 @b87b9e3: GPT-3 175B (NVIDIA's NeMo implementation; configs named by each submission's
    # README; its 11,616-GPU entry, eos-dfw_n1452_ngc24.04_nemo, holds v4.0's logs of that submission, the same files,
    # and is counted under v4.0)
    "v4.1": [
        ("NVIDIA", "b200_n8_preview_nemo", "gpt3", 64, "config_DGXB200_8x8x1024x4x8_mbs2_cg.sh"),
        ("NVIDIA", "eos_n32_ngc24.09_nemo", "gpt3", 256, "config_DGXH100_32x8x256x4x8_mbs2.sh"),
        ("NVIDIA", "eos_n64_ngc24.09_nemo", "gpt3", 512, "config_DGXH100_64x8x128x4x8_mbs2.sh"),
    ],
    # training_results_v5.0 @0fdc28f: Llama 3.1 405B (configs named by each submission's README)
    "v5.0": [
        ("IBM+CoreWeave+NVIDIA", "carina_ngpu512_ngc25.04_nemo", "llama31_405b", 512,
         "config_GB200_128x4x112xtp4pp8cp2.sh"),
        ("IBM+CoreWeave+NVIDIA", "carina_ngpu1024_ngc25.04_nemo", "llama31_405b", 1024,
         "config_GB200_256x4x48xtp4pp8cp2.sh"),
        ("IBM+CoreWeave+NVIDIA", "carina_ngpu1536_ngc25.04_nemo", "llama31_405b", 1536,
         "config_GB200_384x4x48xtp4pp8cp2.sh"),
        ("IBM+CoreWeave+NVIDIA", "carina_ngpu2048_ngc25.04_nemo", "llama31_405b", 2048,
         "config_GB200_512x4x40xtp4pp8cp2.sh"),
        ("IBM+CoreWeave+NVIDIA", "carina_ngpu2496_ngc25.04_nemo", "llama31_405b", 2496,
         "config_GB200_624x4x32xtp4pp8cp2.sh"),
        ("NVIDIA", "tyche_ngpu256_ngc25.04_nemo", "llama31_405b", 256, "config_GB200_64x4x112xtp4pp8cp2_cg.sh"),
        ("NVIDIA", "tyche_ngpu512_ngc25.04_nemo", "llama31_405b", 512, "config_GB200_128x4x112xtp4pp8cp2_cg_dplast.sh"),
        ("NVIDIA", "eos-dfw_n64_ngc25.01_nemo", "llama31_405b", 512, "config_DGXH100_64x8x288xtp8pp8cp2.sh"),
        ("NVIDIA", "eos-dfw_n256_ngc25.01_nemo", "llama31_405b", 2048, "config_DGXH100_256x8x72xtp8pp8cp2.sh"),
        ("NVIDIA", "eos-dfw_n304_ngc25.01_nemo", "llama31_405b", 2432, "config_DGXH100_304x8x64xtp8pp8cp2.sh"),
        ("NVIDIA", "eos-dfw_n320_ngc25.01_nemo", "llama31_405b", 2560, "config_DGXH100_320x8x56xtp8pp8cp2.sh"),
        ("NVIDIA", "eos-dfw_n1024_ngc25.01_nemo", "llama31_405b", 8192, "config_DGXH100_1024x8x24xtp8pp8cp2.sh"),
    ],
    # training_results_v5.1 @441d65f4: Llama 3.1 8B and 405B
    "v5.1": [
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
        ("Dell", "2xXE9680Lx8B200-SXM-180GB", "llama31_8b", 16,
         "config_2xXE9680Lx8B200-SXM-180GB_2x8x2xtp1pp1cp1_8b.sh"),
        ("Dell", "2xXE9685Lx8B200-SXM-180GB", "llama31_8b", 16, "config_XE9685Lx8B200-SXM-180GB_2x8x2xtp1pp1cp1.sh"),
        ("Dell", "1xXE9780x8B300-SXM-270GB", "llama31_8b", 8, "config_XE9780x8B300-SXM-270GB_1x8x2xtp1pp1cp1_8b.sh"),
        # Lenovo's three single-node systems share one configuration (NVFP4); Oracle's 8 BM.GPU.B200.8 hosts (OCI's
        # RoCE cluster network) the only 8-node one of its directory
        ("Lenovo", "SR780aV3-8xB200_SXM_180GB", "llama31_8b", 8, "config_SR780aV3_SR680aV3_SR680aV4.sh"),
        ("Lenovo", "SR680aV3-8xB200_SXM_180GB", "llama31_8b", 8, "config_SR780aV3_SR680aV3_SR680aV4.sh"),
        ("Lenovo", "SR680aV4-8xB300_SXM", "llama31_8b", 8, "config_SR780aV3_SR680aV3_SR680aV4.sh"),
        ("Oracle", "8xBM.GPU.B200.8", "llama31_8b", 64, "config_DGXB200_8x8x1xtp1pp1cp2_8b.sh"),
        # AMD's implementation (NeMo 2 on ROCm with Transformer Engine; its logs give throughput in samples/s) on the
        # MI355X and MI350X, and its MI355X configuration as Dell, Supermicro and GigaComputing submitted it (Cisco's
        # MI350X entry names no configuration and is left out)
        ("AMD", "MI355X_EPYC_9575F_pytorch", "llama31_8b", 8, "config_MI355X_1x8x1_8b.sh"),
        ("AMD", "MI350X_EPYC_9575F_pytorch", "llama31_8b", 8, "config_MI350X_1x8x1_8b.sh"),
        ("Dell", "XE9785L_8xMI355X", "llama31_8b", 8, "config_MI355X_1x8x1_8b.sh"),
        ("Supermicro", "8xMI355X_2xEPYC_9575F", "llama31_8b", 8, "config_MI355X_1x8x1_8b.sh"),
        ("GigaComputing", "G893-ZX1-AAX4_pytorch", "llama31_8b", 8, "config_MI355X_1x8x1_8b.sh"),
    ],
}
STEP_KEYS = ("train_step_time", "train_step_timing in s", "train_step_timing")  # v5.x, v4.1, v3.1


def reader(root: Path):
    """A function from a path in the repository to its text: files of a clone, or HEAD of a bare git directory."""
    if (root / "HEAD").is_file() and not (root / ".git").exists():
        return lambda rel: subprocess.run(["git", f"--git-dir={root}", "show", f"HEAD:{rel}"],
                                          capture_output=True, text=True, check=True).stdout
    return lambda rel: (root / rel).read_text()


def measure(read, org: str, system: str, bench: str) -> tuple[float, int, int, int, int]:
    """(median step s, global batch, sequence length, step records, logs) of one submission's result logs."""
    steps, rates, blocks, gbs, seq, logs = [], [], [], None, None, 0
    names = [f"result_{i}.txt" for i in range(10)] + [f"result_{i:02d}.txt" for i in range(1, 11)]  # Lenovo: 01-10
    for name in names:
        try:
            text = read(f"{org}/results/{system}/{bench}/{name}")
        except (OSError, subprocess.CalledProcessError):
            continue
        logs += 1
        for line in text.splitlines():
            if ":::MLLOG" not in line:
                continue
            rec = json.loads(line.split(":::MLLOG", 1)[1])
            value = rec["value"]
            if rec["key"] == "tracked_stats" and isinstance(value, dict):
                steps += [value[k] for k in STEP_KEYS if k in value]
                rates += [value["throughput"]] if "throughput" in value else []
            elif rec["key"] == "global_batch_size":
                gbs = int(value)
            elif rec["key"] == "max_sequence_length":
                seq = int(value)
            elif rec["key"] in ("block_start", "block_stop"):
                blocks.append((rec["key"], rec["time_ms"], rec["metadata"].get("epoch_count")))
    if not steps and rates:  # AMD's logs: samples per second over the batches since the last record
        steps = [gbs / rate for rate in rates]
    if not steps:  # no step times logged: time the training blocks (module docstring)
        starts = [(t, n) for key, t, n in blocks if key == "block_start"]
        stops = [t for key, t, _ in blocks if key == "block_stop"]
        steps = [(stop - start) / 1e3 / (n / (gbs * seq)) for (start, n), stop in zip(starts, stops)]
    return statistics.median(steps), gbs, seq, len(steps), logs


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ROWS:
        print("usage: python bench/data/mlperf_training.py {" + ",".join(ROWS) + "} PATH", file=sys.stderr)
        return 2
    read = reader(Path(argv[1]))
    for org, system, bench, gpus, config in ROWS[argv[0]]:
        step, gbs, seq, n, logs = measure(read, org, system, bench)
        print(f"{org}/{system}/{bench}: {config}; {logs} logs, {n} step timings, median {step:.6f} s, "
              f"global batch {gbs}, sequence {seq}, {gbs * seq / step / gpus:.1f} tokens/s/GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
