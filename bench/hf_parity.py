"""Tiny Hugging Face architectures as a user meets them: ``meshplan plan`` then ``meshplan run`` on one CPU process
and on four (pinned, e.g. dp 2 x tp 2), the losses of the first steps side by side. A program that trains another
model than the user's shows as different losses at step 1; one that cannot run, as its error.

    python bench/hf_parity.py [--pins "--dp 2 --tp 2"] [--run-args=--compile] [--steps 2] [--seq-len 32] [--layers 2]
                              [--pretrained] [--only llama opt ...]

Each config is tiny (hidden 64, 4 heads and 2 KV heads, 2 layers, vocabulary 256) with dropout off (each rank
draws its own dropout masks, so a run with dropout cannot match one process). Prints one row per architecture:
the plan chosen on four processes (pp, tp, cp, sp, ZeRO) and the losses of both runs. With ``--pretrained`` both
runs start from a checkpoint transformers saved in its own layout (``--init-from``), and the row begins with
transformers' own first loss of it. A benchmark, not a test: about 20 s an architecture on two cores.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
             vocab_size=256, max_position_embeddings=128)
POSITIONS = ("n_positions",)  # what a config calls its longest sequence, beyond max_position_embeddings
LAYERS = ("num_hidden_layers", "n_layer", "n_layers")  # what a config calls its number of blocks
NO_DROPOUT = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout", "dropout",
              "hidden_dropout_prob", "attention_probs_dropout_prob", "summary_first_dropout", "residual_dropout")
# tiny MoE and MLA settings under every name the newer configs use; each config reads the names it knows
MOE = dict(num_experts=4, num_local_experts=4, n_routed_experts=4, moe_num_experts=4, num_experts_per_tok=2,
           moe_topk=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_shared_experts=1, n_group=1,
           topk_group=1, first_k_dense_replace=1)
MLA = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=16, index_head_dim=16, index_n_heads=2, index_topk=8)
# model_type -> (class, config beyond SMALL)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", {}),
    "mistral": ("MistralForCausalLM", {}),
    "mixtral": ("MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=16)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=32)),
    "gemma2": ("Gemma2ForCausalLM", dict(head_dim=16)),
    "gemma3_text": ("Gemma3ForCausalLM", dict(head_dim=16)),
    "phi": ("PhiForCausalLM", {}),
    "olmo2": ("Olmo2ForCausalLM", {}),
    "stablelm": ("StableLmForCausalLM", {}),
    "starcoder2": ("Starcoder2ForCausalLM", {}),
    "gpt_neox": ("GPTNeoXForCausalLM", {}),
    "gptj": ("GPTJForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=8)),
    "gpt2": ("GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64)),
    "opt": ("OPTForCausalLM", dict(ffn_dim=128, word_embed_proj_dim=64)),
    "falcon": ("FalconForCausalLM", {}),
    "bloom": ("BloomForCausalLM", dict(n_head=4, n_layer=2)),
    "gpt_oss": ("GptOssForCausalLM", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "phi3": ("Phi3ForCausalLM", dict(pad_token_id=0)),  # its default pad id lies outside a 256-token vocabulary
    "gemma": ("GemmaForCausalLM", dict(head_dim=16)),
    "cohere": ("CohereForCausalLM", {}),
    "granite": ("GraniteForCausalLM", {}),
    # MLA attention (low-rank q and kv, a rope part of each head), a first dense layer, shared and routed experts
    "deepseek_v3": ("DeepseekV3ForCausalLM", dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32,
                                                  kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                                  v_head_dim=16, n_group=1, topk_group=1)),
    "qwen2_moe": ("Qwen2MoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                              shared_expert_intermediate_size=32)),
    "olmo": ("OlmoForCausalLM", {}),
    "mpt": ("MptForCausalLM", dict(d_model=64, n_heads=4, n_layers=2)),
    "gpt_bigcode": ("GPTBigCodeForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64)),
    "smollm3": ("SmolLM3ForCausalLM", dict(pad_token_id=0)),
    "glm": ("GlmForCausalLM", dict(pad_token_id=0)),
    "olmoe": ("OlmoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2)),
    "granitemoe": ("GraniteMoeForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "glm4_moe": ("Glm4MoeForCausalLM", dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                            first_k_dense_replace=1, n_group=1, topk_group=1, head_dim=16,
                                            pad_token_id=0)),
    "ernie4_5": ("Ernie4_5ForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "llama4_text": ("Llama4ForCausalLM", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=1,
                                              intermediate_size_mlp=128, pad_token_id=0)),
    "seed_oss": ("SeedOssForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "exaone4": ("Exaone4ForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "apertus": ("ApertusForCausalLM", dict(head_dim=16, pad_token_id=0)),  # xIELU: two learned slopes a layer
    "helium": ("HeliumForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "nemotron": ("NemotronForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "olmo3": ("Olmo3ForCausalLM", dict(pad_token_id=0)),
    "qwen3_next": ("Qwen3NextForCausalLM", dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                                pad_token_id=0)),
    "jamba": ("JambaForCausalLM", dict(num_experts=4, num_experts_per_tok=2, pad_token_id=0)),
    # heterogeneous layers: head_dim 16 on the sliding-window layers, global_head_dim 32 on the full ones
    # (config.per_layer_config), and per-layer input embeddings of width 16 beside the token embedding
    "gemma4_text": ("Gemma4ForCausalLM", dict(head_dim=16, global_head_dim=32, hidden_size_per_layer_input=0,
                                              pad_token_id=0)),
    # hybrid linear and full attention (Gated DeltaNet)
    "qwen3_5_text": ("Qwen3_5ForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "qwen3_5_moe_text": ("Qwen3_5MoeForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
    "glm4": ("Glm4ForCausalLM", dict(pad_token_id=0)),
    "ministral3": ("Ministral3ForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "minimax_m2": ("MiniMaxM2ForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
    "hunyuan_v1_dense": ("HunYuanDenseV1ForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "hunyuan_v1_moe": ("HunYuanMoEV1ForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
    "ernie4_5_moe": ("Ernie4_5_MoeForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
    "cohere2": ("Cohere2ForCausalLM", dict(pad_token_id=0)),
    "lfm2": ("Lfm2ForCausalLM", dict(pad_token_id=0)),  # short convolutions beside attention
    "exaone_moe": ("ExaoneMoeForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
    "solar_open": ("SolarOpenForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
    "flex_olmo": ("FlexOlmoForCausalLM", dict(pad_token_id=0, **MOE)),
    "arcee": ("ArceeForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "afmoe": ("AfmoeForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
    # lightning attention in block 1 beside softmax attention in block 0: kept whole over tp there
    "minimax": ("MiniMaxForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
    "deepseek_v2": ("DeepseekV2ForCausalLM", dict(pad_token_id=0, **MOE, **MLA)),
    "deepseek_v32": ("DeepseekV32ForCausalLM", dict(pad_token_id=0, **MOE, **MLA)),  # MLA with its indexer
    "glm4_moe_lite": ("Glm4MoeLiteForCausalLM", dict(pad_token_id=0, **MOE, **MLA)),
    # Mamba-2 mixers beside attention; their time_step_limit holds infinity
    "nemotron_h": ("NemotronHForCausalLM", dict(head_dim=16, pad_token_id=0)),
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM", dict(pad_token_id=0, **MOE)),
    "kimi_linear": ("KimiLinearForCausalLM", dict(head_dim=16, pad_token_id=0, **MOE)),
}
# not listed: PhiMoE, whose router samples its experts in training (sparsemixer: exponential_() and rand_like draws),
# so no two runs match


def write_config(model_type: str, where: Path, seq_len: int = 32, layers: int = 2) -> Path:
    import transformers

    transformers.logging.set_verbosity_error()
    cls, extra = ARCHITECTURES[model_type]
    extra = {key: max(value, seq_len) if key in POSITIONS else layers if key in LAYERS else value
             for key, value in extra.items()}
    cfg = transformers.AutoConfig.for_model(model_type, **{**SMALL, **extra,
                                                          "max_position_embeddings": max(128, seq_len),
                                                          "num_hidden_layers": layers})
    for key in NO_DROPOUT:
        if hasattr(cfg, key):
            setattr(cfg, key, 0.0)
    cfg.architectures = [cls]
    path = where / model_type
    cfg.save_pretrained(path)
    return path


def save_pretrained(model: Path, seq_len: int) -> str:
    """Random weights of the config at ``model``, saved there by transformers in its own checkpoint layout (experts
    one by one for Mixtral, Qwen3-MoE, DeepSeek-V3, ...), the 1-D weights moved off their init so that a load that
    missed them shows; returns the first-step loss of transformers' own ``from_pretrained`` of them on the runs'
    first batch."""
    import torch
    import transformers

    from meshplan.runtime.planned import token_cross_entropy
    from meshplan.runtime.train import synthetic_batch

    config = transformers.AutoConfig.from_pretrained(model)
    torch.manual_seed(0)
    built = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in built.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    built.save_pretrained(model)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    x, y = synthetic_batch(config.vocab_size, 8, seq_len, 0, 1)
    with torch.no_grad():
        return f"{token_cross_entropy(loaded(input_ids=x, use_cache=False).logits, y).item():.6f}"


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def plan_and_run(model: Path, nproc: int, pins: list[str], steps: int, seq_len: int = 32,
                 run_args: list[str] = ()) -> str:
    """'pp1 tp2 cp1 ep1 sp0 z2  5.568831 5.584849', or where it stopped and the last line of its error."""
    plan = model / f"plan{nproc}.json"
    done = _cli("plan", "-q", "--model", f"hf:{model}", "--cluster", f"cpu:1x{nproc}", "--global-batch", "8",
                "--seq-len", str(seq_len), "-o", str(plan), *pins)
    if done.returncode:
        return "plan failed: " + ((done.stderr or done.stdout).strip().splitlines() or ["?"])[-1][:160]
    p = json.loads(plan.read_text())
    mesh = p["mesh"]
    what = (f"pp{mesh['pp']} tp{mesh['tp']} cp{mesh['cp']} ep{mesh.get('ep', 1)} sp{int(p['sequence_parallel'])} "
            f"z{p['zero_stage']}")
    done = _cli("run", str(plan), "--nproc", str(nproc), "--steps", str(steps), "-q", *run_args)
    losses = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("step ")]
    if done.returncode or len(losses) != steps:
        errors = [line for line in (done.stderr + done.stdout).splitlines() if "Error" in line] or ["?"]
        return f"{what}  run failed: {errors[-1].strip()[:160]}"
    return f"{what}  {' '.join(losses)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pins", default="--dp 2 --tp 2", help="meshplan plan pins for the 4-process run")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32, help="tokens a sequence (context parallelism keeps at "
                        "least 1,024 a rank: --seq-len 2048 with --cp 2)")
    parser.add_argument("--layers", type=int, default=2, help="blocks (4 for --pp 2 --vp 2)")
    parser.add_argument("--run-args", default="", help="meshplan run flags for the 4-process run only, e.g. "
                        "'--compile' (the one-process run stays eager)")
    parser.add_argument("--only", nargs="*", choices=sorted(ARCHITECTURES), help="these architectures only")
    parser.add_argument("--pretrained", action="store_true", help="both runs start from a checkpoint transformers "
                        "saved (--init-from), and a column gives transformers' own first loss of it")
    args = parser.parse_args()
    flags = " ".join(part for part in (args.pins, args.run_args) if part)
    first = f"{'transformers':13s}" if args.pretrained else ""
    print(f"{'architecture':24s} {first}{'one process':32s} four processes ({flags})")
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in args.only or ARCHITECTURES:
            model = write_config(model_type, Path(tmp), args.seq_len, args.layers)
            init = ["--init-from", str(model)] if args.pretrained else []
            reference = f"{save_pretrained(model, args.seq_len):13s}" if args.pretrained else ""
            one = plan_and_run(model, 1, [], args.steps, args.seq_len, init)
            four = plan_and_run(model, 4, shlex.split(args.pins), args.steps, args.seq_len,
                                shlex.split(args.run_args) + init)
            print(f"{ARCHITECTURES[model_type][0]:24s} {reference}{one:32s} {four}", flush=True)


if __name__ == "__main__":
    main()
