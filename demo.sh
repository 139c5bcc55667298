#!/usr/bin/env bash
# The main job: plan Llama 3 70B, as Hugging Face's LlamaForCausalLM builds it from its config.json,
# on 64 H100s and print the report; then plan a tiny Hugging Face Llama on 4 CPU processes, emit its
# training program (it builds transformers' model from the plan's inline config) and run it with
# torchrun for a few steps.
set -euo pipefail
cd "$(dirname "$0")"
bash .ci/setup
. .venv/bin/activate
export OMP_NUM_THREADS=1
mkdir -p out
meshplan plan --model hf:examples/hf/llama3-70b --cluster h100-sxm:8x8 --global-batch 512 --seq-len 4096 --top 3 \
    -o out/llama3-70b.plan.json
echo
meshplan plan --model hf:examples/hf/llama-tiny --cluster cpu:1x4 --global-batch 8 --seq-len 64 \
    -o out/llama-tiny.plan.json
meshplan emit out/llama-tiny.plan.json -o out/train_llama_tiny.py
python -m torch.distributed.run --nproc-per-node 4 --master-port "${MASTER_PORT:-29511}" \
    out/train_llama_tiny.py --steps 5
