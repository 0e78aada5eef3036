"""A BERT sentence encoder in Flax NNX, pooled as sentence-transformers pools it: the model of
all-MiniLM-L6-v2 (`zoo.minilm_l6_v2()`) and other BERT-based sentence-transformers directories
with mean pooling.

Shapes: B batch, L tokens, H hidden (384 for MiniLM-L6), N heads, D = H / N head dim,
F intermediate (FFN) size, V vocab, P max positions.

Forward (transformers' `BertModel`, absolute positions, inference so no dropout):
embeddings = LayerNorm(word[ids] + position[0..L) + token_type[0]); then per layer
x = LayerNorm(x + Dense(SelfAttention(x, mask))), x = LayerNorm(x + Dense(gelu(Dense(x))))
with the exact (erf) GELU. The sentence embedding is the mean of the last hidden states over the
mask (sum / clamp(count, 1e-9)), divided by max(L2 norm, 1e-12), as sentence-transformers'
Pooling(mean) + Normalize compute it. Everything runs in float32.

    from jaxsocial.models import encoder, zoo
    enc = encoder.SentenceEncoder.from_pretrained(zoo.minilm_l6_v2())
    texts = ["A man is eating food.", "A man is eating a piece of bread."]
    emb = enc.encode(texts)                        # numpy [2, 384]; emb[0] @ emb[1] = 0.755
    ids, mask = enc.tokenize(texts)                # [B, L] int32 each, right-padded
    emb = enc(ids, mask)                           # [B, 384] jax float32 (eager)
    emb, hidden = enc.forward(ids, mask)           # jitted: + last hidden states [B, L, 384]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

Array = jax.Array

WEIGHTS_FILE = "model.safetensors"
# Tensors a BertModel checkpoint may hold that the sentence embedding does not use.
IGNORED_TENSORS = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_MASK_VALUE = float(jnp.finfo(jnp.float32).min)


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Architecture of one BERT encoder (field names follow transformers' BertConfig) and the
    tokens per text `encode` keeps (`max_seq_length`, sentence-transformers' setting)."""

    vocab_size: int = 30522
    hidden_size: int = 384
    intermediate_size: int = 1536
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    max_seq_length: int = 256

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        if not 0 < self.max_seq_length <= self.max_position_embeddings:
            raise ValueError(f"max_seq_length={self.max_seq_length} must be in "
                             f"[1, max_position_embeddings={self.max_position_embeddings}]")
        if self.type_vocab_size < 1:
            raise ValueError(f"type_vocab_size={self.type_vocab_size} must be >= 1")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dir(cls, path: str) -> "EncoderConfig":
        """From a sentence-transformers directory: config.json (a `bert` model, `gelu`,
        absolute positions), `max_seq_length` from sentence_bert_config.json when present (else
        max_position_embeddings); modules.json, when present, may list only Transformer,
        Pooling and Normalize modules (a Dense head would change the embedding), and the
        pooling config (1_Pooling/config.json), when present, must say mean pooling.
        One-line ValueError / FileNotFoundError otherwise."""
        hf = _read_json(os.path.join(path, "config.json"))
        if hf.get("model_type") != "bert":
            raise ValueError(f"{path}/config.json: model_type {hf.get('model_type')!r} is not "
                             f"'bert'; SentenceEncoder loads BERT encoders only")
        act = hf.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"{path}/config.json: hidden_act {act!r} is not supported "
                             f"(only 'gelu', the exact erf GELU)")
        pos = hf.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError(f"{path}/config.json: position_embedding_type {pos!r} is not "
                             f"supported (only 'absolute')")
        fields = {f.name for f in dataclasses.fields(cls)} - {"max_seq_length"}
        kw = {k: hf[k] for k in fields if hf.get(k) is not None}
        st = os.path.join(path, "sentence_bert_config.json")
        max_pos = int(kw.get("max_position_embeddings", cls.max_position_embeddings))
        seq = _read_json(st).get("max_seq_length") if os.path.isfile(st) else None
        kw["max_seq_length"] = int(seq) if seq else max_pos
        pooling = os.path.join(path, _check_modules(path), "config.json")
        if os.path.isfile(pooling):
            modes = {k for k, v in _read_json(pooling).items()
                     if k.startswith("pooling_mode") and v}
            if modes != {"pooling_mode_mean_tokens"}:
                raise ValueError(f"{pooling}: pooling {sorted(modes)} is not supported (only "
                                 f"pooling_mode_mean_tokens)")
        return cls(**kw)


_MODULES = ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
            "sentence_transformers.models.Normalize")


def _check_modules(path: str) -> str:
    """The pooling module's sub-directory ("1_Pooling" without a modules.json); ValueError
    naming any module of modules.json other than Transformer, Pooling and Normalize."""
    file = os.path.join(path, "modules.json")
    if not os.path.isfile(file):
        return "1_Pooling"
    with open(file, encoding="utf-8") as f:
        try:
            modules = json.load(f)
        except ValueError as e:
            raise ValueError(f"cannot read {file}: {e}") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{file} does not hold a list of modules")
    other = [m.get("type") for m in modules if m.get("type") not in _MODULES]
    if other:
        raise ValueError(f"{file} lists module(s) {other} that SentenceEncoder does not "
                         f"implement (only Transformer, Pooling(mean), Normalize)")
    pooling = [m.get("path") or "" for m in modules if m.get("type") == _MODULES[1]]
    return pooling[0] if pooling else "1_Pooling"


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found (expected a sentence-transformers "
                                f"model directory)")
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {type(e).__name__}: {e}") from None
    if not isinstance(out, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return out


# ----------------------------------------------------------------------------------------------
# Modules


def _param(rngs: nnx.Rngs, shape: Sequence[int], names: tuple, init: str = "normal"):
    """A float32 parameter with logical axis names (`partitioning.LOGICAL_AXIS_RULES`); random
    init is N(0, 0.02) as BERT's, LayerNorm weights ones, biases zeros."""
    if init == "ones":
        value = jnp.ones(shape, jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(shape, jnp.float32)
    else:
        value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
    return nnx.Param(value, out_sharding=names, eager_sharding=False)


class LayerNorm(nnx.Module):
    """x [..., H] -> (x - mean) / sqrt(var + eps) * weight + bias (biased variance, as torch)."""

    def __init__(self, dim: int, eps: float, rngs: nnx.Rngs):
        self.weight = _param(rngs, (dim,), ("norm",), "ones")
        self.bias = _param(rngs, (dim,), ("norm",), "zeros")
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + self.eps) * self.weight[...] + self.bias[...]


class Dense(nnx.Module):
    """x [..., I] -> x @ kernel [I, O] + bias [O] (the kernel is HF's weight transposed)."""

    def __init__(self, d_in: int, d_out: int, names: tuple, rngs: nnx.Rngs):
        self.kernel = _param(rngs, (d_in, d_out), names)
        self.bias = _param(rngs, (d_out,), names[1:], "zeros")

    def __call__(self, x: Array) -> Array:
        return x @ self.kernel[...] + self.bias[...]


class EncoderLayer(nnx.Module):
    """One post-LayerNorm BERT layer: x [B, L, H], key mask [B, L] bool -> [B, L, H]."""

    def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
        h, f = cfg.hidden_size, cfg.intermediate_size
        self.query = Dense(h, h, ("embed", "q_heads"), rngs)
        self.key = Dense(h, h, ("embed", "q_heads"), rngs)
        self.value = Dense(h, h, ("embed", "q_heads"), rngs)
        self.attention_output = Dense(h, h, ("q_heads", "embed"), rngs)
        self.attention_norm = LayerNorm(h, cfg.layer_norm_eps, rngs)
        self.intermediate = Dense(h, f, ("embed", "mlp"), rngs)
        self.output = Dense(f, h, ("mlp", "embed"), rngs)
        self.output_norm = LayerNorm(h, cfg.layer_norm_eps, rngs)
        self.n, self.d = cfg.num_attention_heads, cfg.head_dim

    def __call__(self, x: Array, mask: Array) -> Array:
        b, t, _ = x.shape
        heads = lambda y: y.reshape(b, t, self.n, self.d)  # noqa: E731
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = jnp.einsum("bqnd,bknd->bnqk", q, k) * (self.d ** -0.5)
        # Padded keys get the float32 minimum (as BERT's additive mask): a row with no real
        # token attends uniformly instead of giving NaN.
        scores = jnp.where(mask[:, None, None, :], scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1)
        attended = jnp.einsum("bnqk,bknd->bqnd", probs, v).reshape(b, t, self.n * self.d)
        x = self.attention_norm(x + self.attention_output(attended))
        ffn = self.output(jax.nn.gelu(self.intermediate(x), approximate=False))
        return self.output_norm(x + ffn)


class SentenceEncoder(nnx.Module):
    """BERT + mean pooling + L2 normalisation.

    - `enc(input_ids [B, L] int, attention_mask [B, L])` -> [B, H] float32 unit-norm sentence
      embeddings (eager; `enc.embed` is the same under jit);
    - `enc.hidden_states(...)` -> [B, L, H], BertModel's last_hidden_state (`enc.forward` jits
      both and returns (embeddings, hidden states));
    - `enc.encode(texts)` -> numpy [N, H], with the directory's tokenizer (`enc.tokenize`).
    """

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs, path: Optional[str] = None):
        self.config = config
        # The directory the weights came from (its tokenizer.json serves `encode`); None for a
        # randomly initialised encoder.
        self.path = None if path is None else os.path.abspath(path)
        h = config.hidden_size
        self.word_embeddings = _param(rngs, (config.vocab_size, h), ("vocab", "embed"))
        self.position_embeddings = _param(rngs, (config.max_position_embeddings, h),
                                          (None, "embed"))
        self.token_type_embeddings = _param(rngs, (config.type_vocab_size, h), (None, "embed"))
        self.embeddings_norm = LayerNorm(h, config.layer_norm_eps, rngs)
        self.layers = nnx.List([EncoderLayer(config, rngs)
                                for _ in range(config.num_hidden_layers)])

    def hidden_states(self, input_ids: Array, attention_mask: Optional[Array] = None) -> Array:
        """input_ids [B, L] int (L <= max_position_embeddings), attention_mask [B, L] (1 = real
        token, 0 = padding; None = all real) -> last hidden states [B, L, H] float32. Token type
        0 everywhere, positions 0..L-1 (right padding, as BERT tokenizers pad)."""
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
        b, t = input_ids.shape
        if t > self.config.max_position_embeddings:
            raise ValueError(f"{t} tokens exceed max_position_embeddings="
                             f"{self.config.max_position_embeddings}")
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        if tuple(attention_mask.shape) != (b, t):
            raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids "
                             f"shape {(b, t)}")
        mask = jnp.asarray(attention_mask).astype(bool)
        x = (jnp.take(self.word_embeddings[...], jnp.asarray(input_ids), axis=0)
             + self.position_embeddings[...][:t][None]
             + self.token_type_embeddings[...][0])
        x = self.embeddings_norm(x)
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None) -> Array:
        """input_ids [B, L] int, attention_mask [B, L] -> [B, H] float32 unit-norm embeddings
        (a row without any real token gives zeros)."""
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        return pool(self.hidden_states(input_ids, attention_mask), attention_mask)

    def forward(self, input_ids: Array, attention_mask: Array) -> Tuple[Array, Array]:
        """Under jit: input_ids [B, L] int, attention_mask [B, L] -> (embeddings [B, H] as
        `self(...)`, last hidden states [B, L, H]), both float32; one compile per (B, L)."""
        graphdef, state = nnx.split(self)
        return _forward_jit(graphdef, state, jnp.asarray(input_ids, jnp.int32),
                            jnp.asarray(attention_mask, jnp.int32))

    def embed(self, input_ids: Array, attention_mask: Array) -> Array:
        """`self(input_ids, attention_mask)` under jit: [B, L] -> [B, H] float32 (`forward`)."""
        return self.forward(input_ids, attention_mask)[0]

    # ------------------------------------------------------------------------------------------
    # Text

    def tokenize(self, texts: Sequence[str], length: Optional[int] = None
                 ) -> Tuple[np.ndarray, np.ndarray]:
        """texts (N strings) -> (input_ids, attention_mask), numpy int32 [N, L], right-padded
        with the pad id. Each text is cut at `config.max_seq_length` tokens ([CLS] and [SEP]
        included, as sentence-transformers cuts it). L = `length` if given (at least the
        longest text), else the longest text."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, not one string")
        if self.path is None:
            raise ValueError("this SentenceEncoder has no tokenizer (it was not loaded with "
                             "from_pretrained); pass token ids to it instead")
        tok = _tokenizer(os.path.join(self.path, "tokenizer.json"), self.config.max_seq_length)
        rows = [e.ids for e in tok.encode_batch(list(texts))]
        longest = max((len(r) for r in rows), default=0)
        if length is not None and length < longest:
            raise ValueError(f"length={length} is shorter than the longest text ({longest} "
                             f"tokens)")
        width = longest if length is None else length
        ids = np.full((len(rows), width), self.config.pad_token_id, np.int32)
        mask = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
            mask[i, :len(r)] = 1
        return ids, mask

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """texts (N strings) -> numpy float32 [N, H] unit-norm embeddings (sentence-transformers'
        `encode(..., normalize_embeddings=True)` of the same directory). Texts are sorted by
        length and run in batches of at most `batch_size`; each batch is padded to a power of
        two of rows and of tokens (at least 16, at most max_seq_length), so repeated calls
        reuse the compiled programs."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, not one string")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        texts = list(texts)
        out = np.zeros((len(texts), self.config.hidden_size), np.float32)
        if not texts:
            return out
        ids, mask = self.tokenize(texts)
        lengths = mask.sum(axis=1)
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(texts), batch_size):
            rows = order[start:start + batch_size]
            width = _bucket(int(lengths[rows].max()), 16, self.config.max_seq_length)
            height = _bucket(len(rows), 1, batch_size)
            bids = np.full((height, width), self.config.pad_token_id, np.int32)
            bmask = np.zeros((height, width), np.int32)
            w = min(width, ids.shape[1])
            bids[:len(rows), :w] = ids[rows, :w]
            bmask[:len(rows), :w] = mask[rows, :w]
            out[rows] = np.asarray(self.embed(bids, bmask))[:len(rows)]
        return out

    # ------------------------------------------------------------------------------------------
    # Loading

    @classmethod
    def from_pretrained(cls, path: str) -> "SentenceEncoder":
        """Load a sentence-transformers BERT directory (config.json, model.safetensors,
        tokenizer.json; e.g. `zoo.minilm_l6_v2()`). Every tensor of `tensor_shapes(config)`
        must be in model.safetensors with that shape (HF [out, in] layout, any float dtype,
        cast to float32); tensors in `IGNORED_TENSORS` are skipped and any other is refused.
        One-line ValueError / FileNotFoundError naming the file or tensor otherwise."""
        from safetensors import safe_open

        path = os.path.abspath(os.fspath(path))
        config = EncoderConfig.from_dir(path)
        weights = os.path.join(path, WEIGHTS_FILE)
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"{weights} not found")
        model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), path=path))
        targets = _tensor_targets(model)
        try:
            st_cm = safe_open(weights, framework="numpy")
        except Exception as e:  # safetensors raises its own error types
            raise ValueError(f"cannot read {weights}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
        with st_cm as st:
            names = set(st.keys())
            for name in targets:
                if name not in names:
                    raise ValueError(f"missing tensor {name!r} in {weights}")
            unexpected = sorted(names - set(targets) - set(IGNORED_TENSORS))
            if unexpected:
                raise ValueError(f"{weights} has {len(unexpected)} tensor(s) a BERT encoder of "
                                 f"this config does not use, e.g. {unexpected[:3]}")
            for name, (var, transpose) in targets.items():
                want = tuple(var.get_value().shape)
                want = want[::-1] if transpose else want
                got = tuple(st.get_slice(name).get_shape())
                if got != want:
                    raise ValueError(f"tensor {name!r} in {weights} has shape {got}, expected "
                                     f"{want}")
                t = st.get_tensor(name)
                if not np.issubdtype(t.dtype, np.floating):
                    raise ValueError(f"tensor {name!r} in {weights} has dtype {t.dtype}, "
                                     f"expected a float type")
                t = t.astype(np.float32, copy=False)
                var.set_value(jnp.asarray(np.ascontiguousarray(t.T if transpose else t)))
        return model


def tensor_shapes(config: EncoderConfig) -> Dict[str, Tuple[int, ...]]:
    """Every tensor `from_pretrained` reads: HF name -> HF shape (Linear weights [out, in])."""
    model = nnx.eval_shape(lambda: SentenceEncoder(config, rngs=nnx.Rngs(0)))
    out = {}
    for name, (var, transpose) in _tensor_targets(model).items():
        shape = tuple(var.get_value().shape)
        out[name] = shape[::-1] if transpose else shape
    return out


def _tensor_targets(model: SentenceEncoder) -> Dict[str, Tuple[nnx.Variable, bool]]:
    """HF tensor name -> (our parameter, transposed?), the explicit BertModel mapping."""
    out = {
        "embeddings.word_embeddings.weight": (model.word_embeddings, False),
        "embeddings.position_embeddings.weight": (model.position_embeddings, False),
        "embeddings.token_type_embeddings.weight": (model.token_type_embeddings, False),
        "embeddings.LayerNorm.weight": (model.embeddings_norm.weight, False),
        "embeddings.LayerNorm.bias": (model.embeddings_norm.bias, False),
    }
    for i, layer in enumerate(model.layers):
        p = f"encoder.layer.{i}."
        dense = {"attention.self.query": layer.query, "attention.self.key": layer.key,
                 "attention.self.value": layer.value,
                 "attention.output.dense": layer.attention_output,
                 "intermediate.dense": layer.intermediate, "output.dense": layer.output}
        for hf, mod in dense.items():
            out[p + hf + ".weight"] = (mod.kernel, True)
            out[p + hf + ".bias"] = (mod.bias, False)
        for hf, norm in (("attention.output.LayerNorm", layer.attention_norm),
                         ("output.LayerNorm", layer.output_norm)):
            out[p + hf + ".weight"] = (norm.weight, False)
            out[p + hf + ".bias"] = (norm.bias, False)
    return out


# ----------------------------------------------------------------------------------------------
# Pooling


def mean_pool(hidden: Array, attention_mask: Array) -> Array:
    """hidden [B, L, H], attention_mask [B, L] -> [B, H]: the mean over real tokens,
    sum(hidden * mask) / clamp(sum(mask), 1e-9) (sentence-transformers' mean pooling)."""
    m = jnp.asarray(attention_mask).astype(hidden.dtype)[..., None]
    return jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)


def normalize(x: Array, eps: float = 1e-12) -> Array:
    """x [..., H] -> x / max(||x||_2, eps) along the last axis (torch F.normalize)."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def pool(hidden: Array, attention_mask: Array) -> Array:
    """hidden [B, L, H], attention_mask [B, L] -> [B, H] sentence embeddings:
    normalize(mean_pool(...)), sentence-transformers' Pooling(mean) + Normalize."""
    return normalize(mean_pool(hidden, attention_mask))


@functools.partial(jax.jit, static_argnums=0)
def _forward_jit(graphdef, state, input_ids, attention_mask):
    hidden = nnx.merge(graphdef, state).hidden_states(input_ids, attention_mask)
    return pool(hidden, attention_mask), hidden


def _bucket(n: int, lo: int, hi: int) -> int:
    """The smallest power of two >= max(n, lo), capped at hi (hi >= n)."""
    return min(hi, 1 << (max(n, lo) - 1).bit_length())


@functools.lru_cache(maxsize=8)
def _tokenizer(file: str, max_length: int):
    """The `tokenizers.Tokenizer` of tokenizer.json, cut at max_length tokens, no padding (the
    file's own padding / truncation settings, e.g. MiniLM's fixed 128, are replaced)."""
    from tokenizers import Tokenizer

    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} not found (SentenceEncoder.encode needs the model "
                                f"directory's tokenizer.json)")
    tok = Tokenizer.from_file(file)
    tok.no_padding()
    tok.enable_truncation(max_length)
    return tok
