"""GGUF checkpoints (llama.cpp's format) -> `jaxsocial.models.llama.Llama`.

A GGUF file holds the architecture and the tokenizer as metadata (`llama.block_count`,
`tokenizer.ggml.tokens`, `tokenizer.chat_template`, ...) and the weights as (possibly
quantized) tensors. Reading uses the `gguf` package (llama.cpp's own reader, a core
dependency): `gguf.GGUFReader` memory-maps the file and `gguf.quants.dequantize` turns each
tensor into float32, one tensor at a time.

Layout: a GGUF tensor of GGML shape `ne = [in, out]` dequantizes to a numpy `[out, in]` array,
which is Hugging Face's layout, so the HF checkpoint code's parameter list and transposes are
reused. llama.cpp's `convert_hf_to_gguf.py` permutes the rows of q_proj and k_proj (per head,
from HF's rotate-half RoPE layout to GGML's interleaved pairs); `unpermute_qk` inverts it.
Tensor names: `token_embd`, `blk.{i}.attn_{norm,q,k,v,output}`, `blk.{i}.ffn_{norm,gate,up,
down}`, `output_norm`, `output` (absent when the embeddings are tied), `rope_freqs` (Llama 3.1+
rope scaling, stored as per-frequency divisors).

Errors are one line (ValueError, FileNotFoundError, ImportError) naming the file and the reason.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from typing import Any, Optional, Union

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsocial.models import hf_layout, llama, zoo

PathLike = Union[str, os.PathLike]

GGUF_SUFFIX = ".gguf"
_MAGIC = b"GGUF"
SUPPORTED_ARCHITECTURES = ("llama",)

# HF tensor-name pieces -> GGUF tensor-name pieces (llama.cpp's gguf-py TensorNameMap).
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
              "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
_ROPE_FREQS = "rope_freqs.weight"


def _import_gguf():
    try:
        import gguf as gguf_lib
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("reading GGUF checkpoints needs the 'gguf' package: "
                          "pip install -e . (or pip install gguf)") from None
    return gguf_lib


def gguf_name(hf_name: str) -> str:
    """HF tensor name ('model.layers.3.self_attn.q_proj.weight') -> GGUF ('blk.3.attn_q.weight')."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    prefix = "model.layers."
    if hf_name.startswith(prefix) and hf_name.endswith(".weight"):
        i, rest = hf_name[len(prefix):-len(".weight")].split(".", 1)
        if rest in _LAYER_NAMES:
            return f"blk.{int(i)}.{_LAYER_NAMES[rest]}.weight"
    raise KeyError(f"no GGUF name for tensor {hf_name!r}")


# ----------------------------------------------------------------------------------------------
# Finding and opening files


def _has_magic(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


def find_gguf(path: PathLike) -> Optional[str]:
    """The GGUF file `path` names, or None when `path` is not a GGUF checkpoint.

    A file counts when it ends in `.gguf` or starts with the GGUF magic; a directory counts
    when it has no `config.json` (an HF checkpoint wins) and holds `*.gguf` files: exactly one,
    else ValueError listing them.
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        return path if path.endswith(GGUF_SUFFIX) or _has_magic(path) else None
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        files = sorted(f for f in os.listdir(path) if f.endswith(GGUF_SUFFIX))
        if len(files) > 1:
            raise ValueError(f"directory {path!r} holds {len(files)} GGUF files {files}; "
                             "pass the path of the one to load")
        if files:
            return os.path.join(path, files[0])
    return None


def open_reader(path: PathLike):
    """`gguf.GGUFReader(path)` with one-line errors for missing, non-GGUF and truncated files.

    Besides the header (which GGUFReader parses), checks that every tensor's data lies inside
    the file, since a memory map of a truncated file would otherwise fail later and obscurely.
    """
    gguf_lib = _import_gguf()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path!r}")
    size = os.path.getsize(path)
    if not _has_magic(path):
        raise ValueError(f"{path!r} is not a GGUF file (no 'GGUF' magic at the start)")
    try:
        reader = gguf_lib.GGUFReader(path, "r")
    except Exception as e:  # the reader raises assorted errors on a short/corrupt header
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"GGUF file {path!r} is truncated or corrupt ({type(e).__name__}: "
                         f"{reason[:200]}; file is {size} bytes)") from None
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != int(t.n_bytes):
            raise ValueError(f"GGUF file {path!r} is truncated: tensor {t.name!r} needs bytes "
                             f"up to {end}, the file has {size}")
    return reader


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return value


# ----------------------------------------------------------------------------------------------
# Config


def _rope_freqs_scaling(path: str, reader, arch: str, theta: float, head_dim: int,
                        factors: np.ndarray) -> dict:
    """llama3 rope scaling from a `rope_freqs` tensor (per-frequency divisors of inv_freq).

    llama.cpp's converter stores the scaled frequencies, not the parameters. The standard
    Llama 3.1/3.2 parameters (low 1, high 4, original context from the metadata or 8192,
    factor = the largest divisor) are taken and verified against the tensor; anything else is
    rejected rather than guessed.
    """
    factor = float(_field(reader, f"{arch}.rope.scaling.factor", 0.0) or np.max(factors))
    orig = int(_field(reader, f"{arch}.rope.scaling.original_context_length", 0) or 8192)
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": orig}
    cfg = llama.LlamaConfig(hidden_size=head_dim, num_attention_heads=1, num_key_value_heads=1,
                            rope_theta=theta, rope_scaling=scaling)
    base = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    want = np.asarray(llama.rope_inv_freq(cfg), np.float64)
    got = base / factors.astype(np.float64)
    if factors.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=0):
        raise ValueError(f"GGUF file {path!r}: unsupported rope scaling: tensor {_ROPE_FREQS!r} "
                         "does not match llama3 scaling with the standard parameters "
                         f"{scaling}")
    return scaling


def config_from_gguf(path: PathLike, reader=None) -> llama.LlamaConfig:
    """A `LlamaConfig` from a GGUF file's metadata (llama.cpp's `{arch}.*` keys).

    Layers, heads, kv heads, hidden, intermediate, head dim, RoPE theta and scaling (none,
    linear, or llama3 via a `rope_freqs` tensor), RMSNorm epsilon, context length, vocab (from
    the metadata or the token list), tied embeddings (no `output.weight` tensor) and the
    bos/eos/pad ids. Raises ValueError naming the file for an unsupported architecture or
    rope setting, or missing metadata.
    """
    path = os.fspath(path)
    reader = reader if reader is not None else open_reader(path)
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF file {path!r}: unsupported architecture {arch!r}; supported: "
                         f"{SUPPORTED_ARCHITECTURES} (Qwen2/Qwen3/Mistral load from a Hugging "
                         "Face safetensors directory, not from GGUF)")

    def need(key):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"GGUF file {path!r}: missing metadata key {arch}.{key!s}")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", heads) or heads)
    head_dim = int(_field(reader, f"{arch}.attention.key_length", 0) or hidden // heads)
    rot = int(_field(reader, f"{arch}.rope.dimension_count", 0) or head_dim)
    if rot != head_dim:
        raise ValueError(f"GGUF file {path!r}: partial rotary embeddings "
                         f"(rope.dimension_count={rot}, head dim {head_dim}) are not supported")
    if _field(reader, f"{arch}.expert_count", 0):
        raise ValueError(f"GGUF file {path!r}: mixture-of-experts models are not supported")
    theta = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))

    tensors = {t.name: t for t in reader.tensors}
    scaling_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    if _ROPE_FREQS in tensors:
        factors = dequantize_tensor(path, tensors[_ROPE_FREQS]).reshape(-1)
        scaling = _rope_freqs_scaling(path, reader, arch, theta, head_dim, factors)
    elif scaling_type in ("none", None):
        scaling = None
    elif scaling_type == "linear":
        scaling = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    else:
        raise ValueError(f"GGUF file {path!r}: unsupported rope scaling type {scaling_type!r}; "
                         "supported: none, linear, llama3 (rope_freqs)")

    vocab = _field(reader, f"{arch}.vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        if tokens is not None:
            vocab = len(tokens.data)
        elif "token_embd.weight" in tensors:
            vocab = int(tensors["token_embd.weight"].shape[-1])
        else:
            raise ValueError(f"GGUF file {path!r}: cannot tell the vocab size (no "
                             f"{arch}.vocab_size, token list or token_embd.weight)")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    if eos is not None and eot is not None and int(eot) != int(eos):
        eos = (int(eos), int(eot))
    elif eos is None and eot is not None:
        eos = int(eot)
    as_int = lambda v: None if v is None else int(v)  # noqa: E731
    return llama.LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=int(need("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        # llama.cpp stores float32; kept as that float32 value, as transformers does.
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensors,
        bos_token_id=as_int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=eos if isinstance(eos, tuple) else as_int(eos),
        pad_token_id=as_int(_field(reader, "tokenizer.ggml.padding_token_id")),
    )


# ----------------------------------------------------------------------------------------------
# Tensors


@functools.lru_cache(maxsize=None)
def _can_dequantize(qtype) -> bool:
    """Whether `gguf.quants.dequantize` implements `qtype` (tried on one zero block)."""
    gguf_lib = _import_gguf()
    T = gguf_lib.GGMLQuantizationType
    if qtype in (T.F32, T.F16, T.F64):
        return True
    if qtype in (T.I8, T.I16, T.I32, T.I64):
        return False  # integer tensors are not weights
    try:
        block, type_size = gguf_lib.GGML_QUANT_SIZES[qtype]
        gguf_lib.quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
    except Exception:  # NotImplementedError, or a type this gguf version does not know
        return False
    return True


def dequantize_tensor(path: str, tensor) -> np.ndarray:
    """One GGUF tensor as float32 numpy in HF layout (GGML `ne` reversed)."""
    gguf_lib = _import_gguf()
    qtype = tensor.tensor_type
    if not _can_dequantize(qtype):
        raise ValueError(f"GGUF file {path!r}: tensor {tensor.name!r} has unsupported "
                         f"quantization type {getattr(qtype, 'name', qtype)}")
    shape = tuple(int(n) for n in reversed(tensor.shape))
    # Values are passed on as they are, NaN and inf included (an F64 value beyond float32's
    # range becomes inf): `loading.load` names the first non-finite tensor, so no cast warning
    # here should speak first or for it.
    with np.errstate(over="ignore", invalid="ignore"):
        if qtype == gguf_lib.GGMLQuantizationType.F64:
            out = np.asarray(tensor.data, np.float64).astype(np.float32)
        else:
            out = np.asarray(gguf_lib.quants.dequantize(tensor.data, qtype), np.float32)
    return out.reshape(shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation: `w` [n_heads * D, in] (GGUF) -> HF layout.

    The converter reshapes the rows to [heads, 2, D/2] and swaps the last two axes (HF's
    rotate-half halves become interleaved pairs); this reshapes to [heads, D/2, 2] and swaps
    back. k uses the kv-head count.
    """
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's own permutation (HF layout -> GGUF), the inverse of `unpermute_qk`."""
    rows = w.shape[0]
    return (w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# ----------------------------------------------------------------------------------------------
# Loading


def from_gguf(path: PathLike, dtype: Any = None, param_dtype: Any = None) -> llama.Llama:
    """Load a GGUF Llama file into a `Llama` (dequantized to float32, then cast).

    `dtype` / `param_dtype` as in `checkpoint_hf.from_pretrained` (float32 by default).
    Every tensor's type and shape is checked before any is dequantized; the model is built
    abstractly and filled one tensor at a time. Raises ValueError naming the file and the
    reason for an unsupported architecture or quantization type, a truncated file, a missing,
    misshapen or unexpected tensor.
    """

    path = os.fspath(path)
    reader = open_reader(path)
    dtype, param_dtype = hf_layout.default_dtypes(dtype, param_dtype)
    config = config_from_gguf(path, reader).replace(dtype=dtype, param_dtype=param_dtype)
    tensors = {t.name: t for t in reader.tensors}
    specs = hf_layout.param_specs(config)
    names = {s.hf_name: gguf_name(s.hf_name) for s in specs}

    unexpected = sorted(set(tensors) - set(names.values()) - {_ROPE_FREQS})
    if unexpected:
        raise ValueError(f"GGUF file {path!r} has {len(unexpected)} tensor(s) a Llama with this "
                         f"config does not use, e.g. {unexpected[:3]}")
    model = nnx.eval_shape(lambda: llama.Llama(config, rngs=nnx.Rngs(0)))
    for spec in specs:  # validate everything before the (slow) dequantization
        name = names[spec.hf_name]
        if name not in tensors:
            raise ValueError(f"GGUF file {path!r}: missing tensor {name!r}")
        qtype = tensors[name].tensor_type
        if not _can_dequantize(qtype):
            raise ValueError(f"GGUF file {path!r}: tensor {name!r} has unsupported "
                             f"quantization type {getattr(qtype, 'name', qtype)}")
        want = tuple(spec.get(model).get_value().shape)
        want_hf = want[::-1] if spec.transpose else want
        got = tuple(int(n) for n in reversed(tensors[name].shape))
        if got != want_hf:
            raise ValueError(f"GGUF file {path!r}: shape mismatch for tensor {name!r}: "
                             f"expected {want_hf}, got {got}")

    target = jnp.dtype(llama.as_dtype(param_dtype))
    for spec in specs:
        name = names[spec.hf_name]
        t = dequantize_tensor(path, tensors[name])
        if name.endswith(".attn_q.weight"):
            t = unpermute_qk(t, config.num_attention_heads)
        elif name.endswith(".attn_k.weight"):
            t = unpermute_qk(t, config.num_key_value_heads)
        if spec.transpose:
            t = t.T
        spec.get(model).set_value(jnp.asarray(np.ascontiguousarray(t.astype(target, copy=False))))
        del t
    return model


def _tokenizer_cache_dir(path: str) -> str:
    """Where the tokenizer converted from GGUF file `path` is kept: the cache directory of
    `jaxsocial.models.zoo`, keyed by the file's absolute path, size and mtime and by the
    transformers version (a changed file or converter gets a new entry)."""
    import transformers  # deferred: heavy, only tokenizers need it


    st = os.stat(path)
    key = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}"
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(zoo.cache_dir(), "gguf-tokenizers", f"{stem}-{digest}")


def load_tokenizer(path: PathLike, cache: bool = True):
    """transformers' tokenizer built from a GGUF file's metadata (tokens, merges, special ids,
    chat template): `AutoTokenizer.from_pretrained(dir, gguf_file=name)`.

    That conversion reads the whole token list in Python (tens of seconds for a 49K vocab), so
    with `cache` the result is saved once (`save_pretrained`, under `zoo.cache_dir()`) and later
    calls load the saved files (under a second). An unwritable cache is skipped silently.
    """
    from transformers import AutoTokenizer  # deferred: heavy, only tokenizers need it

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path!r}")
    if not _has_magic(path):
        raise ValueError(f"{path!r} is not a GGUF file (no 'GGUF' magic at the start)")
    cached = _tokenizer_cache_dir(path) if cache else None
    if cached and os.path.isfile(os.path.join(cached, "tokenizer.json")):
        return AutoTokenizer.from_pretrained(cached, local_files_only=True)
    directory, name = os.path.split(os.path.abspath(path))
    # transformers parses the file itself; its errors become one line naming the file.
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name,
                                                  local_files_only=True)
    except Exception as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"GGUF file {path!r}: cannot build a tokenizer from it "
                         f"({type(e).__name__}: {reason[:300]})") from None
    if cached:
        try:
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            tmp = tempfile.mkdtemp(dir=os.path.dirname(cached), prefix=".tmp-")
            tokenizer.save_pretrained(tmp)
            try:
                os.rename(tmp, cached)  # atomic; loses harmlessly to a concurrent writer
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass
    return tokenizer
