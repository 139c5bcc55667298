"""``find_structure`` on users' models: Hugging Face (built from tiny configs, no download), a
torchtitan-style Llama, nanoGPT, an MLP stack on float inputs, and the zoo's three families.

Each expected structure is what the model's own source says each module does (its __init__ and
forward), written out here by hand; the frontend finds it by dataflow.
"""
from __future__ import annotations

import importlib
import logging
import time

import pytest
import torch

from meshplan import ir
from meshplan.frontend import trace
from meshplan.frontend.blocks import repeated_lists

from user_models import NanoGPT, TitanLlama, mlp_stack

tf = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
_trace_impl = importlib.import_module("meshplan.frontend.trace")

SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
HF = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, SMALL),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, SMALL),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(SMALL, head_dim=32)),  # head_dim != 64 / 4
    "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM, dict(SMALL, num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM,
                  dict(SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)),
    "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel, dict(vocab_size=256, n_embd=64, n_layer=3, n_head=4, n_positions=128)),
}
DECODER = dict(blocks="model.layers", num_blocks=3, embed="model.embed_tokens", final_norm="model.norm", head="lm_head",
               attn="self_attn", attn_norm="input_layernorm", q="self_attn.q_proj", k="self_attn.k_proj",
               v="self_attn.v_proj", o="self_attn.o_proj", mlp="mlp", mlp_norm="post_attention_layernorm",
               linear_kind="linear", head_dim=16, attn_kwarg="hidden_states", attn_tuple=True)
DENSE = dict(DECODER, mlp_in=("mlp.gate_proj", "mlp.up_proj"), mlp_out="mlp.down_proj")
# Qwen3's q_norm / k_norm (head_dim,) on (b, s, heads, head_dim): split with the heads, dim 2 (tp_plans.head_norm)
QK_NORMS = dict(head_norms=("self_attn.q_norm", "self_attn.k_norm"), head_norm_dim=2)
UNGROUPED = ("fused q/k/v projection whose output is not laid out by heads (q, k and v each whole, side by side, as "
             "Phi-3's and MPT's are: a row split would hand a rank all of q and none of v); tensor parallelism keeps "
             "attention replicated")
EXPECTED = {
    "llama": DENSE,
    "mistral": DENSE,
    "qwen3": dict(DENSE, head_dim=32, **QK_NORMS),
    "mixtral": dict(DECODER, experts="mlp.experts", router="mlp.gate"),
    "qwen3_moe": dict(DECODER, experts="mlp.experts", router="mlp.gate", **QK_NORMS),
    "gpt2": dict(blocks="transformer.h", num_blocks=3, embed="transformer.wte", pos_embed="transformer.wpe",
                 final_norm="transformer.ln_f", head="lm_head", tied_head=True, attn="attn", attn_norm="ln_1",
                 qkv="attn.c_attn", o="attn.c_proj", mlp="mlp", mlp_norm="ln_2", mlp_in=("mlp.c_fc",),
                 mlp_out="mlp.c_proj", linear_kind="conv1d", head_dim=16, attn_tuple=True,
                 notes=("transformer.h.*.attn.c_attn: " + UNGROUPED,)),
}
# (family, layers, hidden, heads, kv_heads, ffn_hidden, vocab, experts, top_k, head_dim)
HF_DIMS = {
    "llama": ("llama", 3, 64, 4, 2, 96, 256, 0, 0, 16),
    "mistral": ("llama", 3, 64, 4, 2, 96, 256, 0, 0, 16),
    "qwen3": ("llama", 3, 64, 4, 2, 96, 256, 0, 0, 32),
    "mixtral": ("moe", 3, 64, 4, 2, 96, 256, 4, 2, 16),
    "qwen3_moe": ("moe", 3, 64, 4, 2, 48, 256, 4, 2, 16),
    "gpt2": ("gpt", 3, 64, 4, 4, 256, 256, 0, 0, 16),
}


def _dims(d: ir.ModelDims) -> tuple:
    return (d.family, d.layers, d.hidden, d.heads, d.kv_heads, d.ffn_hidden, d.vocab, d.experts, d.top_k, d.head_dim)


def hf_model(name: str, **overrides) -> torch.nn.Module:
    config_cls, model_cls, kw = HF[name]
    with torch.device("meta"):
        return model_cls(config_cls(**{**kw, **overrides}))


def _layers_traced(monkeypatch) -> list[int]:
    """How many repeated layers each export sees (2 on the fast path)."""
    seen: list[int] = []
    export_meta = _trace_impl.export_meta

    def spy(model, **kwargs):
        lists = repeated_lists(model)
        seen.append(len(lists[0][1]) if lists else 0)
        return export_meta(model, **kwargs)
    monkeypatch.setattr(_trace_impl, "export_meta", spy)
    return seen


@pytest.mark.parametrize("name", list(HF))
def test_hugging_face_models(monkeypatch, name):
    seen = _layers_traced(monkeypatch)
    model = hf_model(name)
    graph = trace(model)
    assert graph.structure == ir.ModelStructure(**EXPECTED[name])
    assert _dims(graph.dims) == HF_DIMS[name]
    assert seen == [2]  # the fast path: two layers traced, the third copied
    assert graph.param_count == sum(p.numel() for p in model.parameters())
    inputs = [n for n in graph.nodes if n.target == "input"]
    assert [n.outputs[0].shape for n in inputs] == [(ir.BATCH, ir.SEQ)]


def test_grouped_experts_are_counted_as_matmuls():
    """Hugging Face's grouped expert matmul (transformers::grouped_mm_fallback) costs its FLOPs:
    top_k of the experts' three (h, f) matmuls per token."""
    graph = trace(hf_model("mixtral"))
    grouped = [n for n in graph.nodes if "grouped_mm" in n.target and n.module_path == "model.layers.0.mlp.experts"]
    flops = sum(ir.evaluate(n.flops, batch=2, seq=8) for n in grouped)
    assert [n.op for n in grouped] == [ir.OpKind.MATMUL] * 2  # gate_up, then down
    assert flops == 2 * 16 * 2 * 64 * 96 * 3  # 2 * tokens * top_k * h * f * 3


def test_fast_path_equals_the_full_trace_for_a_container_off_the_root():
    model = hf_model("llama", num_hidden_layers=4)
    fast, full = trace(model), trace(model, fast=False)
    assert fast.nodes == full.nodes and fast.blocks == full.blocks and fast.structure == full.structure


def test_a_torchtitan_llama_in_a_module_dict(monkeypatch):
    seen = _layers_traced(monkeypatch)
    model = TitanLlama()  # dim 48, 4 heads of 16: head_dim is not dim / heads
    graph = trace(model)
    assert graph.structure == ir.ModelStructure(
        blocks="layers", num_blocks=4, embed="tok_embeddings", final_norm="norm", head="output", attn="attention",
        attn_norm="attention_norm", q="attention.wq", k="attention.wk", v="attention.wv", o="attention.wo",
        mlp="feed_forward", mlp_norm="ffn_norm", mlp_in=("feed_forward.w1", "feed_forward.w3"),
        mlp_out="feed_forward.w2", head_dim=16)
    assert _dims(graph.dims) == ("llama", 4, 48, 4, 2, 96, 128, 0, 0, 16)
    assert seen == [2]
    assert [b.name for b in graph.blocks] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    full = trace(model, fast=False)
    assert graph.nodes == full.nodes


def test_nanogpt_fused_qkv_and_tied_head():
    graph = trace(NanoGPT())  # 12 heads of 4, one c_attn Linear(48, 144)
    assert graph.structure == ir.ModelStructure(
        blocks="transformer.h", num_blocks=3, embed="transformer.wte", pos_embed="transformer.wpe",
        final_norm="transformer.ln_f", head="lm_head", tied_head=True, attn="attn", attn_norm="ln_1",
        qkv="attn.c_attn", o="attn.c_proj", mlp="mlp", mlp_norm="ln_2", mlp_in=("mlp.c_fc",), mlp_out="mlp.c_proj",
        head_dim=4, notes=("transformer.h.*.attn.c_attn: " + UNGROUPED,))  # nanoGPT's split(n_embd): q, k, v whole
    assert _dims(graph.dims) == ("gpt", 3, 48, 12, 12, 192, 96, 0, 0, 4)  # kv_heads 12, not 144 / 4 = 36


@pytest.mark.parametrize("how", ["tuple", "callable"])
def test_an_mlp_stack_on_float_features(how):
    examples = (torch.randn(8, 32),) if how == "tuple" else (lambda b, s: (torch.randn(b, 32),))
    graph = trace(mlp_stack(), example_inputs=examples)
    assert graph.structure.blocks == "" and graph.structure.num_blocks == 0
    assert not graph.structure.head and not graph.structure.embed
    notes = graph.structure.notes
    assert len(notes) == 1 and "tensor and pipeline parallelism are not offered" in notes[0]
    assert _dims(graph.dims) == ("custom", 0, 32, 0, 0, 64, 0, 0, 0, 0)
    inputs = [n for n in graph.nodes if n.target == "input"]
    assert [n.outputs[0].shape for n in inputs] == [(ir.BATCH, 32)]
    flops = 2 * (32 * 64 + 64 * 64 + 64 * 10) + (64 + 64 + 10)  # per sample: weights and biases
    assert sum(ir.evaluate(n.flops, batch=3, seq=999) for n in graph.nodes if n.op == ir.OpKind.MATMUL) == 3 * flops


def test_float_inputs_with_a_sequence_dim():
    graph = trace(mlp_stack(), example_inputs=lambda b, s: (torch.randn(b, s, 32),), batch=4, seq_len=16)
    inputs = [n for n in graph.nodes if n.target == "input"]
    assert [n.outputs[0].shape for n in inputs] == [(ir.BATCH, ir.SEQ, 32)]
    assert graph.nodes[-1].outputs[0].shape == (ir.BATCH, ir.SEQ, 10)


def test_bad_example_inputs_are_refused():
    with pytest.raises(ir.UnsupportedModelError, match="example_inputs must be a non-empty tuple of tensors"):
        trace(mlp_stack(), example_inputs=[1, 2])
    with pytest.raises(ir.UnsupportedModelError, match=r"example_inputs\[0\] is a scalar"):
        trace(mlp_stack(), example_inputs=(torch.tensor(1.0),))


class _Gated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) if x.sum() > 0 else x


def test_an_untraceable_module_under_example_inputs_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), _Gated())
    with pytest.raises(ir.UnsupportedModelError) as caught:
        trace(model, example_inputs=(torch.randn(4, 32),))
    message = str(caught.value)  # the module, the line and op that failed, the inputs, the reason
    assert "module '1' (test_structure._Gated) at test_structure.py:" in message
    assert "`return self.proj(x) if x.sum() > 0 else x` on the meta device with the example_inputs" in message
    assert "GuardOnDataDependentSymNode" in message


@pytest.mark.parametrize("name, expected", [
    ("gpt-tiny", dict(pos_embed="embed.pos", mlp_in=("mlp.fc1",), mlp_out="mlp.fc2")),
    ("llama-tiny", dict(mlp_in=("mlp.w1", "mlp.w3"), mlp_out="mlp.w2")),
    ("moe-tiny", dict(experts="mlp.experts", router="mlp.router")),
])
def test_zoo_models(traced, name, expected):
    _, graph = traced(name)
    assert graph.structure == ir.ModelStructure(
        blocks="layers", num_blocks=4, embed="embed.tok", final_norm="norm", head="output", attn="attn",
        attn_norm="attn_norm", q="attn.wq", k="attn.wk", v="attn.wv", o="attn.wo", mlp="mlp", mlp_norm="mlp_norm",
        head_dim=16, **expected)


def test_model_dims_head_dim_is_its_own_field():
    gpt_oss = ir.ModelDims(family="moe", layers=24, hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880,
                           vocab=201088, experts=32, top_k=4, head_dim=64)
    assert gpt_oss.head_dim == 64 and 2880 // 64 == 45
    assert ir.ModelDims(family="gpt", layers=1, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=8).head_dim == 16


def test_an_8b_llama_on_meta(monkeypatch):
    seen = _layers_traced(monkeypatch)
    config = tf.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(config)
    start = time.perf_counter()
    graph = trace(model, batch=1, seq_len=8192)
    print(f"8B Llama traced on meta in {time.perf_counter() - start:.1f} s")  # reported, never asserted
    assert seen == [2]
    assert graph.structure == ir.ModelStructure(**dict(DENSE, num_blocks=32, head_dim=128))
    assert _dims(graph.dims) == ("llama", 32, 4096, 32, 8, 14336, 128256, 0, 0, 128)
    assert graph.param_count == sum(p.numel() for p in model.parameters()) == 8_030_261_248
    assert [b.name for b in graph.blocks][-1] == "model.layers.31" and len(set(b.kind for b in graph.blocks)) == 1


def test_data_dependent_grouped_experts_become_a_leaf_with_the_same_flops():
    """experts_implementation="eager" loops over nonzero(): the grouped experts are kept whole
    (leaves.GROUPED_EXPERTS), at the FLOPs the traceable grouped matmuls count."""
    eager = hf_model("mixtral")
    eager.config._experts_implementation = "eager"
    graph, grouped = trace(eager), trace(hf_model("mixtral"))
    leaf = [n for n in graph.nodes if n.leaf and n.module_path == "model.layers.0.mlp.experts"]
    assert [n.op for n in leaf] == [ir.OpKind.MOE]
    assert graph.structure == grouped.structure == ir.ModelStructure(**EXPECTED["mixtral"])
    experts = [n for n in grouped.nodes if n.module_path == "model.layers.0.mlp.experts" and n.op == ir.OpKind.MATMUL]
    assert ir.evaluate(leaf[0].flops, batch=2, seq=8) == sum(ir.evaluate(n.flops, batch=2, seq=8) for n in experts)


class _DuckLM(torch.nn.Module):
    """Not a transformers class, but called the Hugging Face way: input_ids=, use_cache=."""

    def __init__(self) -> None:
        super().__init__()
        self.config = type("Config", (), {"model_type": "duck"})()
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, input_ids: torch.Tensor | None = None, use_cache: bool | None = None) -> torch.Tensor:
        assert use_cache is False  # the frontend asks for no KV cache
        return self.emb(input_ids)


def test_hugging_face_calling_convention_by_class_or_duck_typing(build):
    from meshplan.frontend.inputs import is_huggingface

    assert is_huggingface(hf_model("llama")) and is_huggingface(_DuckLM())
    assert not is_huggingface(build("llama-tiny")) and not is_huggingface(mlp_stack())
    graph = trace(_DuckLM())
    assert [n.outputs[0].shape for n in graph.nodes if n.target == "input"] == [(ir.BATCH, ir.SEQ)]
    assert graph.structure.embed == "emb" and graph.structure.blocks == ""
