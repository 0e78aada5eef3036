"""Hugging Face Llama checkpoints <-> `jaxsocial.models.llama.Llama`.

A Hugging Face directory holds `config.json` and the weights as one `model.safetensors` or
several `model-0000i-of-0000n.safetensors` listed in `model.safetensors.index.json`.

Weight layout: HF `nn.Linear` stores `[out, in]` and computes `x @ W.T`; our kernels are
`[in, out]` and compute `x @ W`, so every projection (and `lm_head`) is transposed on the way
in and out. Embeddings and norm weights keep their layout. Tied checkpoints omit `lm_head`.

Loading builds an abstract model (`nnx.eval_shape`, no memory) and fills it one tensor at a
time, so peak host memory stays near one copy of the weights in the target dtype.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Union

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxsocial.models import gguf, hf_layout, llama

PathLike = Union[str, os.PathLike]

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 2 * 1024 ** 3

_SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
# Tensors some older checkpoints carry that hold no learned state.
_IGNORED_TENSORS = re.compile(r".*rotary_emb\.inv_freq$")


# ----------------------------------------------------------------------------------------------
# config.json <-> LlamaConfig


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _checkpoint_dir(path: PathLike) -> str:
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint directory not found: {path!r}")
    return path


def _rope_from_hf(d: Mapping[str, Any]) -> tuple:
    """(rope_theta, rope_scaling dict or None) from `rope_parameters` (transformers 5) or the
    older top-level `rope_theta` + `rope_scaling`."""
    params = d.get("rope_parameters")
    if isinstance(params, Mapping) and params:
        if any(isinstance(v, Mapping) for v in params.values()):
            raise ValueError(f"unsupported per-layer-type rope_parameters: {dict(params)}")
        theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = d.get("rope_theta", 10000.0)
        scaling = dict(d.get("rope_scaling") or {})
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    if rope_type not in llama.SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: "
                         f"{llama.SUPPORTED_ROPE_TYPES}")
    if rope_type == "default":
        return float(theta), None
    return float(theta), {"rope_type": rope_type, **scaling}


def config_from_hf(source: Union[Mapping[str, Any], PathLike]) -> llama.LlamaConfig:
    """A `LlamaConfig` from an HF config dict, a `config.json` file, or a checkpoint directory.

    Reads only the config's fields (defaults are transformers' LlamaConfig defaults); nothing is
    inferred from the model's name. Raises ValueError naming the value for an unsupported
    `model_type`, rope type, activation, or bias.
    """
    if isinstance(source, Mapping):
        d = dict(source)
    else:
        path = os.fspath(source)
        if os.path.isdir(path):
            file = os.path.join(path, CONFIG_NAME)
            if not os.path.isfile(file):
                raise FileNotFoundError(f"no {CONFIG_NAME} in checkpoint directory {path!r}")
        elif os.path.isfile(path):
            file = path
        else:
            raise FileNotFoundError(f"checkpoint directory not found: {path!r}")
        d = _read_json(file)

    model_type = d.get("model_type")
    if model_type != "llama":
        raise ValueError(f"unsupported model_type {model_type!r}; only 'llama' (the Llama-3 "
                         "family) is supported")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r}; Llama uses 'silu'")
    for key in ("attention_bias", "mlp_bias"):
        if d.get(key, False):
            raise ValueError(f"unsupported {key}={d[key]!r}; Llama-3 has no biases")
    theta, scaling = _rope_from_hf(d)
    heads = d.get("num_attention_heads", 32)
    return llama.LlamaConfig(
        vocab_size=d.get("vocab_size", 32000),
        hidden_size=d.get("hidden_size", 4096),
        intermediate_size=d.get("intermediate_size", 11008),
        num_hidden_layers=d.get("num_hidden_layers", 32),
        num_attention_heads=heads,
        num_key_value_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim"),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=d.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=d.get("eos_token_id"),
        pad_token_id=d.get("pad_token_id"),
    )


def _ids(value):
    return list(value) if isinstance(value, (tuple, list)) else value


def config_to_hf(config: llama.LlamaConfig) -> dict:
    """The `config.json` dict transformers' `LlamaForCausalLM` reads.

    RoPE is written both as `rope_parameters` (transformers 5) and as the older `rope_theta` +
    `rope_scaling` pair, so older readers (transformers 4, vLLM) see the same settings.
    """
    scaling = {k: v for k, v in (config.rope_scaling_dict or {}).items()
               if k not in ("type", "rope_type")}
    legacy_scaling = {"rope_type": config.rope_type, **scaling} if scaling else None
    rope_parameters = {"rope_type": config.rope_type, "rope_theta": config.rope_theta, **scaling}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": rope_parameters,
        "rope_theta": config.rope_theta,
        "rope_scaling": legacy_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": _ids(config.eos_token_id),
        "pad_token_id": config.pad_token_id,
        "dtype": config.param_dtype,
    }


# ----------------------------------------------------------------------------------------------
# Loading


def _weight_map(path: str) -> Dict[str, str]:
    """tensor name -> safetensors file (absolute) for a checkpoint directory."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, Mapping):
            raise ValueError(f"{index} has no 'weight_map'")
        out = {name: os.path.join(path, file) for name, file in weight_map.items()}
        for file in sorted(set(out.values())):
            if not os.path.isfile(file):
                raise FileNotFoundError(f"shard {os.path.basename(file)!r} listed in {index} "
                                        "is missing")
        return out
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in checkpoint directory {path!r}")
    out = {}
    for f in files:
        with safe_open(os.path.join(path, f), framework="numpy") as st:
            for name in st.keys():
                out[name] = os.path.join(path, f)
    return out


def from_pretrained(path: PathLike, dtype: Any = None, param_dtype: Any = None) -> llama.Llama:
    """Load an HF Llama directory into a `Llama`. A `.gguf`
    file, or a directory holding one and no config.json, goes to `gguf.from_gguf`.

    `dtype` is the compute dtype and `param_dtype` the storage dtype: float32 for both by
    default; giving only one sets both. Tensors of any stored dtype (f32, bf16, f16) are cast.
    """


    gguf_file = gguf.find_gguf(path)
    if gguf_file is not None:
        return gguf.from_gguf(gguf_file, dtype=dtype, param_dtype=param_dtype)
    path = _checkpoint_dir(path)
    dtype, param_dtype = hf_layout.default_dtypes(dtype, param_dtype)
    config = config_from_hf(path).replace(dtype=dtype, param_dtype=param_dtype)
    weight_map = _weight_map(path)
    specs = hf_layout.param_specs(config)

    for spec in specs:
        if spec.hf_name not in weight_map:
            raise ValueError(f"missing tensor {spec.hf_name!r} in checkpoint {path!r}")
    expected = {s.hf_name for s in specs}
    if config.tie_word_embeddings:
        expected.add("lm_head.weight")  # tied checkpoints may still store a copy; ignored
    unexpected = sorted(n for n in weight_map if n not in expected and
                        not _IGNORED_TENSORS.match(n))
    if unexpected:
        raise ValueError(f"checkpoint {path!r} has {len(unexpected)} tensor(s) this config does "
                         f"not use, e.g. {unexpected[:3]}")

    model = nnx.eval_shape(lambda: llama.Llama(config, rngs=nnx.Rngs(0)))
    target = jnp.dtype(llama.as_dtype(param_dtype))
    by_file: Dict[str, List[hf_layout.TensorSpec]] = {}
    for spec in specs:
        by_file.setdefault(weight_map[spec.hf_name], []).append(spec)
    for file, file_specs in by_file.items():
        with safe_open(file, framework="numpy") as st:
            for spec in file_specs:
                var = spec.get(model)
                want = tuple(var.get_value().shape)
                want_hf = want[::-1] if spec.transpose else want
                got = tuple(st.get_slice(spec.hf_name).get_shape())
                if got != want_hf:
                    raise ValueError(f"shape mismatch for tensor {spec.hf_name!r}: expected "
                                     f"{want_hf}, got {got} (in {os.path.basename(file)})")
                t = st.get_tensor(spec.hf_name)
                if spec.transpose:
                    t = t.T
                var.set_value(jnp.asarray(np.ascontiguousarray(t.astype(target, copy=False))))
                del t
    return model


# ----------------------------------------------------------------------------------------------
# Saving


def _hf_tensor(var: nnx.Variable, transpose: bool) -> np.ndarray:
    t = np.asarray(var.get_value())
    return np.ascontiguousarray(t.T if transpose else t)


def save_pretrained(model: llama.Llama, path: PathLike,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
    """Write `model` as an HF directory that `transformers.LlamaForCausalLM` loads.

    Writes config.json, generation_config.json and the weights in the model's parameter dtype:
    one `model.safetensors`, or when the weights exceed `max_shard_bytes`, shards
    `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`. Weight files of an
    earlier save in the same directory are replaced. Peak extra memory: one shard.
    """

    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    config = model.config
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    for f in os.listdir(path):
        if f in (SINGLE_FILE, INDEX_FILE) or re.fullmatch(r"model-\d+-of-\d+\.safetensors", f):
            os.remove(os.path.join(path, f))

    specs = hf_layout.param_specs(config)
    shards: List[List[hf_layout.TensorSpec]] = [[]]
    size = 0
    total = 0
    for spec in specs:
        var = spec.get(model)
        nbytes = int(np.prod(var.get_value().shape)) * jnp.dtype(var.get_value().dtype).itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
        total += nbytes

    n = len(shards)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = SINGLE_FILE if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        tensors = {s.hf_name: _hf_tensor(s.get(model), s.transpose) for s in shard}
        save_file(tensors, os.path.join(path, name), metadata={"format": "pt"})
        del tensors
        weight_map.update({s.hf_name: name for s in shard})
    if n > 1:
        with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    with open(os.path.join(path, CONFIG_NAME), "w", encoding="utf-8") as f:
        json.dump(config_to_hf(config), f, indent=2)
    gen = {"bos_token_id": config.bos_token_id, "eos_token_id": _ids(config.eos_token_id),
           "pad_token_id": config.pad_token_id}
    with open(os.path.join(path, GENERATION_CONFIG_NAME), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in gen.items() if v is not None}, f, indent=2)


# ----------------------------------------------------------------------------------------------
# Tokenizers


def load_tokenizer(path: PathLike, model: Optional[Union[llama.Llama, llama.LlamaConfig]] = None):
    """`transformers.AutoTokenizer.from_pretrained(path)` (local files only); for a GGUF
    file (or a directory holding one) the tokenizer is built from its metadata.

    With `model` (a Llama or LlamaConfig), raises ValueError when the tokenizer has more tokens
    (`len(tokenizer)`, special tokens included) than the model's embedding has rows.
    """
    from transformers import AutoTokenizer  # deferred: heavy, only tokenizers need it


    gguf_file = gguf.find_gguf(path)
    if gguf_file is not None:
        path = gguf_file
        tokenizer = gguf.load_tokenizer(gguf_file)
    else:
        path = _checkpoint_dir(path)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if model is not None:
        config = model if isinstance(model, llama.LlamaConfig) else model.config
        if len(tokenizer) > config.vocab_size:
            raise ValueError(f"tokenizer at {path!r} has {len(tokenizer)} tokens but the model's "
                             f"embedding has only vocab_size={config.vocab_size} rows")
    return tokenizer
