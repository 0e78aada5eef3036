"""Hugging Face checkpoints (Llama, Mistral, Qwen2/2.5, Qwen3) <-> `jaxsocial.models.llama.Llama`.

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
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

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
# config.json <-> LlamaConfig (every supported family)


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


# transformers 5.24's config-class defaults for the keys read here, per model_type (a key absent
# from config.json means what transformers' own config class would give it). `head_dim` None:
# hidden_size // num_attention_heads. `num_key_value_heads` None: num_attention_heads.
_COMMON_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=None, head_dim=None,
                        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
                        eos_token_id=None, pad_token_id=None)
HF_DEFAULTS = {
    "llama": dict(_COMMON_DEFAULTS, intermediate_size=11008, max_position_embeddings=2048,
                  bos_token_id=1, eos_token_id=2),
    "mistral": dict(_COMMON_DEFAULTS, intermediate_size=14336, num_key_value_heads=8,
                    max_position_embeddings=131072, bos_token_id=1, eos_token_id=2,
                    sliding_window=4096),
    "qwen2": dict(_COMMON_DEFAULTS, vocab_size=151936, intermediate_size=22016,
                  num_key_value_heads=32, max_position_embeddings=32768,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28),
    "qwen3": dict(_COMMON_DEFAULTS, vocab_size=151936, intermediate_size=22016,
                  num_key_value_heads=32, head_dim=128, max_position_embeddings=32768,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28,
                  attention_bias=False),
}
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _windows_from_hf(d: Mapping[str, Any], get, model_type: str, layers: int) -> tuple:
    """(sliding_window, layer_types) as transformers' model of `model_type` applies them."""
    if model_type == "llama":
        return None, None  # LlamaModel has no sliding window, whatever the config says
    if model_type == "mistral":
        # MistralModel applies `sliding_window` (when not None) to every layer and ignores
        # layer_types (transformers points mixed windows to Ministral): refuse a mismatch.
        window = get("sliding_window")
        types = d.get("layer_types")
        want = "full_attention" if window is None else "sliding_attention"
        if types is not None and any(t != want for t in types):
            raise ValueError(f"unsupported mistral layer_types {list(types)} with sliding_window="
                             f"{window!r}: MistralModel applies one window to every layer "
                             "(mixed windows are Ministral's, not supported)")
        return window, None
    # qwen2 / qwen3: the window exists only with use_sliding_window; layer_types (or, absent,
    # layers >= max_window_layers) say which layers slide.
    window = get("sliding_window") if get("use_sliding_window") else None
    types = d.get("layer_types")
    if types is None:
        types = ["sliding_attention" if window is not None and i >= get("max_window_layers")
                 else "full_attention" for i in range(layers)]
    types = tuple(types)
    if window is None:
        if "sliding_attention" in types:
            raise ValueError(f"{model_type} layer_types has 'sliding_attention' layers but "
                             f"use_sliding_window={get('use_sliding_window')!r} / sliding_window="
                             f"{d.get('sliding_window')!r} give no window")
        return None, None
    return int(window), types


def config_from_hf(source: Union[Mapping[str, Any], PathLike]) -> llama.LlamaConfig:
    """A `LlamaConfig` from an HF config dict, a `config.json` file, or a checkpoint directory.

    Supported model_types: llama, mistral, qwen2, qwen3 (`llama.SUPPORTED_MODEL_TYPES`). Reads
    only the config's fields; a missing key takes the default of transformers' config class for
    that model_type (`HF_DEFAULTS`), so model_type selects only what HF's own class implies
    (Qwen2's q/k/v bias, Qwen3's QK-norm); nothing is inferred from a model's name. Raises
    ValueError naming the value for an unsupported model_type, rope type, activation, bias or
    layer_types.
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
    if model_type not in HF_DEFAULTS:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: "
                         f"{', '.join(llama.SUPPORTED_MODEL_TYPES)}")
    defaults = HF_DEFAULTS[model_type]

    def get(key):
        return d.get(key, defaults.get(key))

    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r}; {model_type} uses 'silu'")
    # Biases as transformers builds them: Llama's attention_bias / mlp_bias are not supported
    # here; Qwen2 always has q/k/v biases (Qwen2Config has no attention_bias key); Qwen3's
    # attention_bias puts biases on q, k, v and o; Mistral has none.
    bad_bias = ("attention_bias", "mlp_bias") if model_type == "llama" else ("mlp_bias",)
    for key in bad_bias:
        if d.get(key, False):
            raise ValueError(f"unsupported {key}={d[key]!r} for model_type {model_type!r}")
    qkv_bias = o_bias = False
    if model_type == "qwen2":
        qkv_bias = True
    elif model_type == "qwen3":
        qkv_bias = o_bias = bool(get("attention_bias"))
    theta, scaling = _rope_from_hf(d)
    heads = get("num_attention_heads")
    layers = get("num_hidden_layers")
    window, layer_types = _windows_from_hf(d, get, model_type, layers)
    return llama.LlamaConfig(
        vocab_size=get("vocab_size"),
        hidden_size=get("hidden_size"),
        intermediate_size=get("intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=get("num_key_value_heads") or heads,
        head_dim=get("head_dim"),
        rms_norm_eps=float(get("rms_norm_eps")),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(get("tie_word_embeddings")),
        bos_token_id=get("bos_token_id"),
        eos_token_id=get("eos_token_id"),
        pad_token_id=get("pad_token_id"),
        model_type=model_type,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        qk_norm=model_type == "qwen3",
        sliding_window=window,
        layer_types=layer_types,
    )


def _ids(value):
    return list(value) if isinstance(value, (tuple, list)) else value


def _check_exportable(config: llama.LlamaConfig) -> None:
    """Raise ValueError when `config`'s switches are not what transformers' class for
    `config.model_type` builds (the saved directory would load as a different model)."""
    t = config.model_type
    want = {"llama": dict(qkv_bias=False, o_bias=False, qk_norm=False),
            "mistral": dict(qkv_bias=False, o_bias=False, qk_norm=False),
            "qwen2": dict(qkv_bias=True, o_bias=False, qk_norm=False),
            "qwen3": dict(o_bias=config.qkv_bias, qk_norm=True)}[t]
    if t == "llama":
        want.update(sliding_window=None)
    if t in ("llama", "mistral"):
        want.update(layer_types=None)
    bad = {k: getattr(config, k) for k, v in want.items() if getattr(config, k) != v}
    if bad:
        raise ValueError(f"cannot save as model_type {t!r}: transformers' {_ARCHITECTURES[t]} "
                         f"has {want}, this config has {bad}")


def config_to_hf(config: llama.LlamaConfig) -> dict:
    """The `config.json` dict transformers' `*ForCausalLM` for `config.model_type` reads.

    RoPE is written both as `rope_parameters` (transformers 5) and as the older `rope_theta` +
    `rope_scaling` pair, so older readers (transformers 4, vLLM) see the same settings. Raises
    ValueError when the config's switches do not fit its model_type (`_check_exportable`).
    """
    _check_exportable(config)
    t = config.model_type
    scaling = {k: v for k, v in (config.rope_scaling_dict or {}).items()
               if k not in ("type", "rope_type")}
    legacy_scaling = {"rope_type": config.rope_type, **scaling} if scaling else None
    rope_parameters = {"rope_type": config.rope_type, "rope_theta": config.rope_theta, **scaling}
    out = {
        "architectures": [_ARCHITECTURES[t]],
        "model_type": t,
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
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": _ids(config.eos_token_id),
        "pad_token_id": config.pad_token_id,
        "dtype": config.param_dtype,
    }
    if t == "llama":
        out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    elif t == "mistral":
        out.update(sliding_window=config.sliding_window)
    else:
        windows = config.layer_windows
        types = ["full_attention" if w is None else "sliding_attention" for w in windows]
        out.update(use_sliding_window=config.sliding_window is not None,
                   sliding_window=config.sliding_window,
                   max_window_layers=next((i for i, w in enumerate(windows) if w is not None),
                                          config.num_hidden_layers),
                   layer_types=types)
        if t == "qwen3":
            out.update(attention_bias=config.qkv_bias)
    return out


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
    """Load an HF directory of any supported family (`config_from_hf`) into a `Llama`. A `.gguf`
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
# Finite weights


def non_finite_tensors(model: llama.Llama) -> List[Tuple[str, int, int]]:
    """[(HF tensor name, NaN count, inf count)] of every weight holding a non-finite value, in
    `hf_layout.param_specs` order (embeddings first). Empty when all weights are finite."""
    bad = []
    for spec in hf_layout.param_specs(model.config):
        v = spec.get(model).get_value()
        if bool(jnp.isfinite(v).all()):
            continue
        bad.append((spec.hf_name, int(jnp.isnan(v).sum()), int(jnp.isinf(v).sum())))
    return bad


def check_finite(model: llama.Llama, what: str) -> None:
    """Raise ValueError naming the first non-finite tensor of `model` (`what` says whose
    weights they are: a checkpoint path, "the policy to export", ...)."""
    bad = non_finite_tensors(model)
    if bad:
        name, nans, infs = bad[0]
        more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
        raise ValueError(f"{what}: tensor {name!r} holds non-finite values ({nans} NaN, "
                         f"{infs} inf){more}")


# ----------------------------------------------------------------------------------------------
# Saving


def _hf_tensor(var: nnx.Variable, transpose: bool) -> np.ndarray:
    t = np.asarray(var.get_value())
    return np.ascontiguousarray(t.T if transpose else t)


def save_pretrained(model: llama.Llama, path: PathLike,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
    """Write `model` as an HF directory that transformers loads as `config.model_type`'s
    `*ForCausalLM` (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM).

    Writes config.json, generation_config.json and the weights in the model's parameter dtype:
    one `model.safetensors`, or when the weights exceed `max_shard_bytes`, shards
    `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`. Weight files of an
    earlier save in the same directory are replaced. Peak extra memory: one shard. A model
    holding NaN or inf is refused (ValueError naming the tensor) before anything is written.
    """

    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    config = model.config
    hf_config = config_to_hf(config)  # raises before anything is written
    check_finite(model, f"refusing to export a non-finite model to {os.fspath(path)!r}")
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
        json.dump(hf_config, f, indent=2)
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


def export_problem(path: PathLike) -> Optional[str]:
    """None when `path` is a complete HF directory: its config.json parses, every weight the
    config needs is stored with its shape (headers only: no tensor is read), and the tokenizer
    loads and fits the vocabulary. Otherwise one line saying what is missing or broken."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return f"{path} does not exist"
    for name in (CONFIG_NAME, "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(path, name)):
            return f"{path}: {name} is missing"
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json",
                                                                 "tokenizer.model")):
        return f"{path}: the tokenizer's files (tokenizer.json) are missing"
    try:
        config = config_from_hf(path)
        weight_map = _weight_map(path)
        specs = hf_layout.param_specs(config)
        model = nnx.eval_shape(lambda: llama.Llama(config, rngs=nnx.Rngs(0)))
        for spec in specs:
            if spec.hf_name not in weight_map:
                return f"{path}: tensor {spec.hf_name!r} is missing"
            want = tuple(spec.get(model).get_value().shape)
            with safe_open(weight_map[spec.hf_name], framework="numpy") as st:
                got = tuple(st.get_slice(spec.hf_name).get_shape())
            if got != (want[::-1] if spec.transpose else want):
                return f"{path}: tensor {spec.hf_name!r} has shape {got}"
        load_tokenizer(path, config)
    except Exception as e:  # noqa: BLE001 -- any failure to read it back means "incomplete"
        return f"{path}: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return None
