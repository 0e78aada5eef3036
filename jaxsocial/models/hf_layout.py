"""The Hugging Face tensor layout of the decoder (every family), shared by the safetensors
(`checkpoint_hf`) and GGUF (`gguf`) readers: every tensor's HF name, where it lives in our
model and whether it is transposed ([out, in] in HF, [in, out] here), and the dtypes a loaded
checkpoint gets.
"""
from __future__ import annotations

from typing import Callable, List, NamedTuple

from flax import nnx

from jaxsocial.models import llama


class TensorSpec(NamedTuple):
    hf_name: str
    get: Callable[[llama.Llama], nnx.Variable]
    transpose: bool  # HF [out, in] <-> ours [in, out]


def param_specs(config: llama.LlamaConfig) -> List[TensorSpec]:
    """Every HF tensor of a *ForCausalLM with `config` (biases and q/k norms when its switches
    say so), in checkpoint order."""
    specs = [TensorSpec("model.embed_tokens.weight", lambda m: m.embed_tokens, False)]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        layer = lambda m, i=i: m.layers[i]  # noqa: E731
        specs.append(TensorSpec(p + "input_layernorm.weight",
                           lambda m, L=layer: L(m).input_layernorm.weight, False))
        for n in ("q", "k", "v", "o"):
            specs.append(TensorSpec(p + f"self_attn.{n}_proj.weight",
                               lambda m, L=layer, n=n: getattr(L(m).self_attn, n + "_proj"), True))
            if config.qkv_bias and n != "o" or config.o_bias and n == "o":
                specs.append(TensorSpec(
                    p + f"self_attn.{n}_proj.bias",
                    lambda m, L=layer, n=n: getattr(L(m).self_attn, n + "_bias"), False))
        if config.qk_norm:
            for n in ("q", "k"):
                specs.append(TensorSpec(
                    p + f"self_attn.{n}_norm.weight",
                    lambda m, L=layer, n=n: getattr(L(m).self_attn, n + "_norm").weight, False))
        specs.append(TensorSpec(p + "post_attention_layernorm.weight",
                           lambda m, L=layer: L(m).post_attention_layernorm.weight, False))
        for n in ("gate", "up", "down"):
            specs.append(TensorSpec(p + f"mlp.{n}_proj.weight",
                               lambda m, L=layer, n=n: getattr(L(m).mlp, n + "_proj"), True))
    specs.append(TensorSpec("model.norm.weight", lambda m: m.norm.weight, False))
    if not config.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", lambda m: m.lm_head, True))
    return specs


def default_dtypes(dtype, param_dtype) -> tuple:
    """(compute, storage) dtype names a loaded checkpoint gets: float32 for both by default,
    or the one given for both."""
    if dtype is None and param_dtype is None:
        return "float32", "float32"
    dtype = llama.dtype_name(llama.as_dtype(dtype if dtype is not None else param_dtype))
    param_dtype = llama.dtype_name(llama.as_dtype(param_dtype if param_dtype is not None
                                                  else dtype))
    return dtype, param_dtype
