"""The layer bound (``ir/limits.MAX_LAYERS`` = 1024) and the work below it.

A model config of 10^5 or 10^6 layers used to build and trace for minutes (issue 15); it is now
refused in one line naming the limit and why it sits there. Below the bound, the loops over layers
that were quadratic (every layer asking every parameter whether it is its own; every fused bias
scanning all parameters) are linear: the tests count the passes over the parameters.
"""
from __future__ import annotations

import json

import pytest
from torch import nn

from meshplan import cli, ir, zoo
from meshplan.codegen.fusion import find_fusions
from meshplan.frontend.blocks import build_blocks
from meshplan.ir import limits
from deadline import within  # tests/deadline.py

CONFIG = {"family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "max_seq_len": 128}
WHY = "the deepest transformer trained so far, DeepNet (2022), has 1,000 layers"


@pytest.mark.parametrize("layers", [limits.MAX_LAYERS + 1, 10**5, 10**6])
def test_a_config_past_the_layer_bound_is_refused_in_one_line(capsys, tmp_path, layers) -> None:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({**CONFIG, "layers": layers}))
    with within(60):
        code = cli.main(["estimate", "--model-config", str(path), "--cluster", "cpu:1x4", "--global-batch", "8",
                         "--seq-len", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"layers must be from 1 to 1024, got {layers}" in err and WHY in err and "typo" in err


def test_the_layer_bound_itself_is_accepted_and_one_more_is_not() -> None:
    assert zoo.ModelConfig.from_dict({**CONFIG, "layers": limits.MAX_LAYERS}).layers == 1024
    with pytest.raises(ir.UnknownModelError, match="got 1025"):
        zoo.ModelConfig.from_dict({**CONFIG, "layers": limits.MAX_LAYERS + 1})


def test_check_sizes_says_why_the_layer_bound_sits_where_it_does() -> None:
    with pytest.raises(ir.PlanError) as err:
        limits.check_sizes(global_batch=8, seq_len=8, layers=limits.MAX_LAYERS + 1)
    assert str(err.value) == (f"layers 1025 exceeds the limit of 1024 (2^10) layers meshplan plans for "
                              f"(ir/limits.py: {WHY}); check it for a typo")


class _Counted(tuple):
    """A tuple that counts the passes over it."""

    passes = 0

    def __iter__(self):
        type(self).passes += 1
        return super().__iter__()


def test_blocks_take_their_parameters_in_one_pass() -> None:
    """Asking every layer about every parameter was a pass over the parameters per layer (10^5 layers:
    10^10 steps); one pass now, also under the alarm at 2 * 10^4 layers."""
    n = 2 * 10**4
    layers = tuple(f"layers.{i}" for i in range(n))
    params = _Counted(ir.Param(name=f"{layer}.{p}", shape=(4,), dtype="float32") for layer in layers for p in "wb")
    _Counted.passes = 0
    with within(120):
        blocks = build_blocks((), params, layers, (nn.Linear,) * n)
    assert _Counted.passes == 1
    assert len(blocks) == n and {b.kind for b in blocks} == {"Linear#0"}
    assert blocks[7].params == ("layers.7.w", "layers.7.b") and blocks[-1].name == f"layers.{n - 1}"


def test_fusions_look_parameters_up_by_name() -> None:
    """Each fused bias scanned the graph's parameters for its shape: a pass per bias, 10^3 here."""
    n = 1000
    x = ir.TensorMeta(shape=(ir.BATCH, 16))
    nodes = [ir.Node(name="x", op=ir.OpKind.OTHER, target="input", outputs=(x,))]
    params = []
    for i in range(n):
        params.append(ir.Param(name=f"l{i}.bias", shape=(16,), dtype="float32"))
        nodes.append(ir.Node(name=f"mm{i}", op=ir.OpKind.MATMUL, target="aten.addmm.default", inputs=("x",),
                             input_metas=(x,), outputs=(x,), params=(f"l{i}.bias",), bytes=2 * x.nbytes + 64))
        nodes.append(ir.Node(name=f"gelu{i}", op=ir.OpKind.ELEMENTWISE, target="aten.gelu.default",
                             inputs=(f"mm{i}",), input_metas=(x,), outputs=(x,), bytes=2 * x.nbytes))
    dims = ir.ModelDims(family="custom", layers=0, hidden=16, heads=1, kv_heads=1, ffn_hidden=0, vocab=1)
    graph = ir.Graph(nodes=tuple(nodes), params=_Counted(params), blocks=(), dims=dims)
    _Counted.passes = 0
    fusions = find_fusions(graph)
    assert _Counted.passes == 1
    assert [f.pattern for f in fusions] == ["bias_gelu"] * n
    assert fusions[-1].args == (("x", f"mm{n - 1}"), ("bias", f"l{n - 1}.bias"))


HF = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512}


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers = 1000000 is outside 1..1024, meshplan's bound on a model's layers"),
    ({"hidden_size": 2**40}, "hidden_size = 1099511627776 is outside 1..1048576"),
    ({"vocab_size": 0}, "vocab_size = 0 is outside 1..16777216"),
    ({"num_hidden_layers": "x"}, "does not fit transformers"),
    ({"model_type": "no-such-model"}, "model_type 'no-such-model' is not one transformers"),
])
def test_a_hugging_face_config_past_the_bounds_is_refused_before_building(tmp_path, change, message) -> None:
    pytest.importorskip("transformers")
    from meshplan.cli_model import hf_model

    (tmp_path / "config.json").write_text(json.dumps({**HF, **change}))
    with within(60), pytest.raises(ir.UnsupportedModelError) as info:  # 10^6 layers built for minutes
        hf_model(str(tmp_path))
    assert message in str(info.value)


def test_the_cli_refuses_a_hugging_face_config_of_a_million_layers_in_one_line(capsys, tmp_path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps({**HF, "num_hidden_layers": 10**6}))
    with within(60):
        code = cli.main(["estimate", "--model", f"hf:{tmp_path}", "--cluster", "cpu:1x4", "--global-batch", "8",
                         "--seq-len", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "num_hidden_layers = 1000000 is outside 1..1024" in err
