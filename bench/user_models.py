"""Plan the users' own models at 7-20B sizes on 64 H100s: the models people train, as their libraries
build them (Hugging Face classes from a config, a torchtitan-style Llama, a hand-written nanoGPT, an
MLP stack with example inputs), each traced on meta and planned from its graph, not from a zoo name.

    python bench/user_models.py [--cluster h100-sxm:8x8] [--global-batch 256] [--seq-len 2048] [--only NAME]

``--only deepseek`` and ``--only gpt-oss`` add the slow rows (``SLOW_MODELS``), 16-21B MoE models.

Prints one row per model: where it comes from, its size, the blocks found, the chosen plan, the
predicted step time and MFU, and the wall time of ``autoparallelize`` (trace + solve). The last rows
compare Hugging Face's Llama-3-8B with the zoo's ``llama3-8b`` under the same plan, term by term, and
both programs without their generated fused kernels: the matmul and attention FLOPs are the same, and
the zoo fuses add_rmsnorm and swiglu where the Hugging Face model runs swiglu on its own LlamaMLP
(``codegen.fused.USER_MODULES``; its decoder layer adds the residual in its own forward, which no
fused method splits). Acceptance (issue 11): the Hugging Face step within 2% of the zoo's.
A benchmark, not a test: wall times depend on the machine's load.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import meshplan as mp  # noqa: E402
import user_models  # noqa: E402


def _hf(model_type: str, **config) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers

        cfg = transformers.AutoConfig.for_model(model_type, **config)
        return transformers.AutoModelForCausalLM.from_config(cfg)
    return build


# (name, builder on meta, example_inputs): configs from each model's published card, 7-21B total
MODELS: list[tuple[str, Callable[[], torch.nn.Module], object]] = [
    ("HF Llama-3-8B", _hf("llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                          max_position_embeddings=8192, rope_theta=500000.0), None),
    ("HF Mistral-7B", _hf("mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                          max_position_embeddings=32768), None),
    ("HF Qwen3-8B", _hf("qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        max_position_embeddings=40960), None),
    # Mixtral's layout at ~7B total (8 experts, top 2), and Qwen3-MoE's (64 experts, top 8)
    ("HF Mixtral (8 x 1.8k)", _hf("mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=1792,
                                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                  num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768), None),
    ("HF Qwen3-MoE (64 x 768)", _hf("qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                    moe_intermediate_size=768, num_hidden_layers=24, num_attention_heads=32,
                                    num_key_value_heads=4, head_dim=128, num_experts=64, num_experts_per_tok=8,
                                    max_position_embeddings=40960), None),
    ("HF GPT-2 (Conv1D) 6.7B", _hf("gpt2", vocab_size=50257, n_embd=4096, n_layer=32, n_head=32,
                                   n_positions=2048), None),
    ("torchtitan-style Llama 3 8B", lambda: user_models.titan_llama(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
        max_seq_len=4096), None),
    ("nanoGPT 6.7B", lambda: user_models.nanogpt(vocab_size=50304, block_size=2048, n_layer=32, n_head=32,
                                                 n_embd=4096), None),
    ("MLP stack (example_inputs)", lambda: user_models.mlp_stack(features=8192, hidden=8192, classes=1000),
     lambda b, s: (torch.randn(b, 8192),)),
]


# planned only when named with --only: their layers are not all alike (DeepSeek's leading dense layer, GPT-OSS's
# alternating sliding window), so the whole model is exported, not two layers, and planning takes minutes.
# DeepSeek-V3's architecture (MLA, 1 leading dense layer, shared experts) at Moonlight-16B-A3B's published
# size (moonshotai/Moonlight-16B-A3B config.json), and GPT-OSS-20B (openai/gpt-oss-20b config.json)
SLOW_MODELS: list[tuple[str, Callable[[], torch.nn.Module], object]] = [
    ("HF DeepSeek-V3 arch (Moonlight-16B)", _hf("deepseek_v3", vocab_size=163840, hidden_size=2048,
                                               intermediate_size=11264, moe_intermediate_size=1408,
                                               num_hidden_layers=27, first_k_dense_replace=1, n_routed_experts=64,
                                               n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1,
                                               num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
                                               kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                               v_head_dim=128, max_position_embeddings=8192), None),
    ("HF GPT-OSS-20B", _hf("gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                           num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                           num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
                           max_position_embeddings=131072), None),
]


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths))


def run(cluster: str, global_batch: int, seq_len: int, only: str | None) -> None:
    widths = [36, 7, 22, 44, 10, 6, 8]
    print(_row(["model", "params", "blocks", "plan", "step", "MFU", "plan s"], widths))
    for name, build, example in MODELS + (SLOW_MODELS if only else []):
        if only and only.lower() not in name.lower():
            continue
        with torch.device("meta"):
            model = build()
        params = sum(p.numel() for p in model.parameters()) / 1e9
        start = time.perf_counter()
        try:
            plan = mp.autoparallelize(model, cluster, global_batch=global_batch, seq_len=seq_len,
                                      example_inputs=example)
        except mp.ir.PlanError as exc:
            print(_row([name, f"{params:.1f}B", "-", f"refused: {exc}"[:200], "", "", ""], widths))
            continue
        wall = time.perf_counter() - start
        st = plan.structure
        blocks = f"{st.get('num_blocks', 0)} x {st.get('blocks') or '-'}"
        pred = plan.prediction
        print(_row([name, f"{params:.1f}B", blocks, plan.summary()[:44], f"{pred.step_time_s * 1e3:.0f} ms",
                    f"{pred.mfu:.0%}", f"{wall:.1f}"], widths))
    if not only or "llama" in only.lower():
        compare_llama(cluster, global_batch, seq_len)


def compare_llama(cluster: str, global_batch: int, seq_len: int) -> None:
    """HF Llama-3-8B against the zoo's llama3-8b under the zoo's chosen plan, term by term."""
    zoo_plan = mp.autoparallelize("llama3-8b", cluster, global_batch=global_batch, seq_len=seq_len)
    pins = dict(tp=zoo_plan.mesh.tp, pp=zoo_plan.mesh.pp, dp=zoo_plan.mesh.dp, cp=zoo_plan.mesh.cp,
                zero=zoo_plan.zero_stage, micro_batch=zoo_plan.micro_batch_size, sp=zoo_plan.sequence_parallel)
    with torch.device("meta"):
        hf = MODELS[0][1]()
    hf_plan = mp.autoparallelize(hf, cluster, global_batch=global_batch, seq_len=seq_len, fixed=pins)
    print(f"\nHF Llama-3-8B vs zoo llama3-8b at the zoo's plan ({zoo_plan.summary()}):")
    for key in ("compute", "exposed_comm", "bubble", "unpriced"):
        z, h = zoo_plan.prediction.time_s.get(key, 0.0), hf_plan.prediction.time_s.get(key, 0.0)
        print(f"  {key:<13} zoo {z * 1e3:8.1f} ms   HF {h * 1e3:8.1f} ms   {h / z - 1 if z else 0.0:+.1%}")
    z, h = zoo_plan.prediction.step_time_s, hf_plan.prediction.step_time_s
    print(f"  {'step':<13} zoo {z * 1e3:8.1f} ms   HF {h * 1e3:8.1f} ms   {h / z - 1:+.1%}   (fused kernels: zoo "
          f"{', '.join(zoo_plan.fusions) or 'none'}; HF {', '.join(hf_plan.fusions) or 'none'})")
    z, h = (_unfused_s(p) for p in (zoo_plan, hf_plan))
    print(f"  {'step, eager':<13} zoo {z * 1e3:8.1f} ms   HF {h * 1e3:8.1f} ms   {h / z - 1:+.1%}   (both --no-fuse)")


def _unfused_s(plan: mp.Plan) -> float:
    """The plan's step time without its fused kernels (the unfused alternative, or its own without any)."""
    unfused = next((a for a in plan.solver.alternatives if a.get("fuse") is False), None)
    return plan.prediction.step_time_s if unfused is None else unfused["step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="h100-sxm:8x8")
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--only", help="run the models whose name contains this")
    args = ap.parse_args()
    run(args.cluster, args.global_batch, args.seq_len, args.only)


if __name__ == "__main__":
    main()
