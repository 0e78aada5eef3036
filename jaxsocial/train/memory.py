"""Bytes per device before a run starts, per compiled program of the epoch (rollout, scoring,
PPO update, and the one-program epoch): parameters, reference, optimizer, gradients, KV cache,
activations, the society and the grammar -- for a Llama config, a (data, fsdp, tensor) mesh
and the rollout/update shapes.

Sharding follows `jaxsocial.train.sharding.LOGICAL_AXIS_RULES` (fsdp shards the embed axis,
tensor shards heads/mlp/vocab; the rows split as `sharding.row_axes` splits them). Each term
is a buffer XLA allocates for the program (read from the buffer assignment of the compiled
programs of configs/general.py at full depth on the CPU backend: `benchmarks/aot_memory.py`,
whose result files docs/scaling.md quotes), counted from the shapes. tests/test_aot_memory.py
compares the estimate with programs it compiles at small shapes the terms were not set against
(the PPO update on 1 and 8 devices, demo.py:smoke's epoch unrolled and scanned). CPU caveat:
the CPU widens bf16 dots to float32 (the float32 weight and LM-head copies counted here) and
packs temporaries less tightly than a GPU/TPU allocator, so these are upper bounds there.
Without remat the per-layer count of Korthikanti et al. (2022) is used besides the
attention, whose saved scores are counted as XLA keeps them on the CPU.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Dict, Optional, Sequence, Tuple

import jax
import numpy as np
from absl import logging

from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models.llama import LlamaConfig, as_dtype
from jaxsocial.train.sharding import AXES, LOGICAL_AXIS_RULES, row_axes

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device, by component, and the peak of each of the epoch's programs.

    programs: {"rollout", "score", "update"} -> per-device bytes alive while that program runs
    (its arguments, outputs and temporaries, plus the run state it does not take), and
    "epoch" for the one-program epoch (`estimate(donate=True)`). `total` is the epoch's figure
    when there is one, else the largest program (the three-program epoch's high-water mark);
    without programs, the sum of the components.
    """

    params: int
    grads: int
    optimizer: int
    reference: int
    kv_cache: int
    activations: int
    programs: Dict[str, int] = dataclasses.field(default_factory=dict)
    # Per program, the estimate's working set beside arguments, outputs and run state (to
    # read against XLA's temp bytes).
    working: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def components(self) -> Dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("programs", "working")}

    @property
    def peak(self) -> int:
        if "epoch" in self.programs:
            return self.programs["epoch"]
        return max(self.programs.values()) if self.programs else sum(self.components.values())

    @property
    def total(self) -> int:
        return self.peak

    def table(self) -> str:
        rows = list(self.components.items())
        rows += [(f"[{k}]", v) for k, v in self.programs.items()] + [("total", self.total)]
        return "\n".join(f"{k:>12s}  {v / GiB:10.3f} GiB" for k, v in rows)


def _param_shapes(cfg: LlamaConfig) -> Dict[str, tuple]:
    """(shape, logical names) of every parameter, summed over layers."""
    h, i, v, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    n, k, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    out = {
        "embed_tokens": ((v, h), ("vocab", "embed"), 1),
        "q_proj": ((h, n * d), ("embed", "q_heads"), L),
        "k_proj": ((h, k * d), ("embed", "kv_heads"), L),
        "v_proj": ((h, k * d), ("embed", "kv_heads"), L),
        "o_proj": ((n * d, h), ("q_heads", "embed"), L),
        "gate_proj": ((h, i), ("embed", "mlp"), L),
        "up_proj": ((h, i), ("embed", "mlp"), L),
        "down_proj": ((i, h), ("mlp", "embed"), L),
        "norms": ((h,), ("norm",), 2 * L + 1),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head"] = ((h, v), ("embed", "vocab"), 1)
    if cfg.qkv_bias:  # Qwen2, Qwen3 with attention_bias
        out["q_bias"] = ((n * d,), ("q_heads",), L)
        out["kv_bias"] = ((k * d,), ("kv_heads",), 2 * L)
    if cfg.o_bias:
        out["o_bias"] = ((h,), ("embed",), L)
    if cfg.qk_norm:  # Qwen3: one [D] weight each for q and k per layer
        out["qk_norm"] = ((d,), ("norm",), 2 * L)
    return out


def _shard_factor(shape, names, mesh: Dict[str, int]) -> int:
    used, factor = set(), 1
    for name, size in zip(names, shape):
        axes = LOGICAL_AXIS_RULES.get(name)
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        axes = tuple(a for a in axes if a not in used and mesh[a] > 1)
        f = math.prod(mesh[a] for a in axes) if axes else 1
        if axes and size % f == 0:
            used.update(axes)
            factor *= f
    return factor


def row_split(rows: int, mesh: Dict[str, int], logical: str = "batch") -> int:
    """How many ways `rows` are split: the largest product of the `logical` rule's mesh axes
    that divides them (`sharding.row_axes`; 96 rows on (4, 16, 1): 16)."""
    return math.prod(mesh[a] for a in row_axes(mesh, logical, rows))


def society_bytes(social_params, mesh_shape: Sequence[int] = (1, 1, 1), *,
                  text_rows: int = 0) -> int:
    """Per-device bytes of one `SocialState` with the shapes `social_params` (a
    `social.state.SocialParams`) asks for, as `sharding.society_shardings` places it: the
    per-user arrays (users, follow graph, reaction / seen records: leading dim num_users) split
    along the `agents` rule's axes that divide num_users when the mesh's data axis is > 1, the
    posts' ring buffer, the agents' inbox and the text banks (text_rows texts of content_len
    tokens) replicated. general.py: 0.148 GiB whole (100,000 users, 65,536 posts, d = 64)."""
    p = social_params
    n, d, cap, ln = p.num_users, p.embed_dim, p.post_capacity, p.content_len
    # Users: persona, activity, num_followers, num_following, last_post, profile_count
    # (int32 / float32) + interest and profile_sum [d] float32; graph: following [F] and
    # muted [M] int32; memory: react_post [R] int32 + react_kind [R] int8, seen [S] int32,
    # seen_head.
    per_user = (6 * 4 + 2 * d * 4 + (p.max_following + p.max_muted) * 4
                + p.reaction_memory * 5 + p.seen_memory * 4 + 4)
    # Posts: 15 int32 fields + tokens [L] int32 + embedding [d] float32; next_id, tick.
    per_post = 15 * 4 + ln * 4 + d * 4
    inbox = p.num_agents * (p.feed_size * 4 + 1)
    text = int(text_rows) * (ln * 4 + d * 4 + 4) + 4
    mesh = dict(zip(AXES, (int(s) for s in mesh_shape)))
    split = row_split(n, mesh, "agents") if mesh["data"] > 1 else 1
    return math.ceil(n / split) * per_user + cap * per_post + inbox + text + 8


def tree_bytes(tree) -> int:
    """Bytes of a pytree of arrays held whole (replicated) on every device, e.g. the
    constrained-decoding grammar ([S, V] bool + int32 tables: general.py's 1191 states x
    128,256 tokens = 0.71 GiB), an argument of every program of the epoch."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree) if hasattr(x, "shape"))


def params_per_device(cfg: LlamaConfig, mesh: Dict[str, int]) -> int:
    """Parameter *count* held by one device under the sharding rules."""
    total = 0
    for shape, names, count in _param_shapes(cfg).values():
        total += count * math.prod(shape) // _shard_factor(shape, names, mesh)
    return total


def estimate(cfg: LlamaConfig, mesh_shape: Sequence[int] = (1, 1, 1), *, batch: int,
             prompt_len: int, response_len: int, train_micro_batch: Optional[int] = None,
             with_reference: bool = True, optimizer_slots: int = 2, lora_rank: int = 0,
             remat: bool = False, trajectories: Optional[int] = None,
             optimizer_dtype: Optional[str] = None, donate: bool = False,
             logits_chunk_bytes: int = 64 * 2 ** 20, rollout_sharded: bool = True,
             score_sharded: bool = False, update_sharded: bool = True,
             minibatch_rows: Optional[int] = None,
             score_micro_batch: int = 0, attention_chunk: int = 0,
             social_params=None, text_rows: int = 0, grammar_bytes: int = 0,
             scan_layers: bool = False, prefill_chunk: Optional[int] = None,
             cohorts: int = 1) -> MemoryEstimate:
    """Per-device bytes of the epoch's programs: rollout, scoring, PPO update (the
    three-program epoch) and, with donate=True, the one-program epoch.

    batch: prompts generated at once (global, the acting agents); trajectories: rows scored
    and trained per epoch (global, default batch); train_micro_batch: rows per gradient step
    (global, default trajectories); optimizer_slots: 2 for Adam(W), whose moments (and the
    gradients) have the parameters' dtype unless optimizer_dtype says otherwise (optax's
    default); lora_rank > 0: float32 adapters are trained, the base is frozen and is the
    reference. donate: the one-program epoch (state donated) is estimated too, and is the
    estimate's peak. rollout_sharded / score_sharded / update_sharded: the rollout's prompts /
    the scored trajectories / the update's micro-batch rows are split along the data axes as
    the loop splits them (`row_split`; False: every device holds all rows).
    logits_chunk_bytes: the largest [rows, chunk, V] float32 logits block
    (`generation.scoring.token_stats`). minibatch_rows: rows per optimizer step (global,
    default train_micro_batch); score_micro_batch > 0: the scoring pass runs that many rows at
    a time (`policy.score_batch` with `micro_batch`), 0: all at once. attention_chunk > 0:
    attention runs in query blocks of that many (`LlamaConfig`). scan_layers: the decoder
    layers run as one `lax.scan` over weights stacked inside the program
    (`LlamaConfig.scan_layers`, general.py's setting); False: unrolled.
    social_params (`social.state.SocialParams`, with text_rows texts in its banks): the
    society, an argument (and output) of the rollout and of the one-program epoch and kept
    alive beside scoring and the update (`society_bytes`), and the rollout's per-tick records
    of every post slot. grammar_bytes: the constrained-decoding tables (`tree_bytes`), an
    argument of the rollout, scoring and the epoch (the update reads its bool table).
    prefill_chunk: the rollout's `SamplingConfig.prefill_chunk` (None: its default); the
    prefill's working set is one chunk's (`SamplingConfig.prefill_chunks`). cohorts: the
    trainable cohorts (`agents.cohorts`, LoRA only), each with its own adapters, value head and
    optimizer state; their unmerged adapters are counted as the merged kernels of one.

    What each program holds, per device (the terms are the buffers XLA allocates for them,
    read from the compiled programs' buffer assignment at Llama-3-8B / 3.2-1B shapes:
    `benchmarks/aot_memory.py`, docs/scaling.md): every program its arguments (weight shards,
    the society, the grammar, the rollout or the batch), its outputs, and the run state it
    does not take (`run_epoch` keeps it); then each program's working set, described where it
    is counted (`_weights`, `_rollout`, `_scoring`, `_update`, `_epoch`).
    """
    w = _weights(cfg, mesh_shape, with_reference=with_reference,
                 optimizer_slots=optimizer_slots, lora_rank=lora_rank,
                 optimizer_dtype=optimizer_dtype, scan_layers=scan_layers, cohorts=cohorts)
    seq = prompt_len + response_len
    rows = int(trajectories or batch)
    society = society_bytes(social_params, mesh_shape, text_rows=text_rows) \
        if social_params is not None else 0
    ro = _rollout(w, batch=batch, rows=rows, prompt_len=prompt_len, response_len=response_len,
                  rollout_sharded=rollout_sharded, attention_chunk=attention_chunk,
                  social_params=social_params, prefill_chunk=prefill_chunk)
    ro["bytes"] = w.state + 2 * society + grammar_bytes + ro["out"] + ro["temp"]
    sc = _scoring(w, rows=rows, seq=seq, response_len=response_len,
                  score_micro_batch=score_micro_batch, score_sharded=score_sharded,
                  attention_chunk=attention_chunk, with_reference=with_reference)
    sc["bytes"] = (w.weights + ro["out"] + grammar_bytes + 2 * society + sc["rows_d"]
                   * response_len * 12 + sc["temp"])
    up = _update(w, rows=rows, seq=seq, response_len=response_len,
                 train_micro_batch=train_micro_batch, update_sharded=update_sharded,
                 minibatch_rows=minibatch_rows, logits_chunk_bytes=logits_chunk_bytes,
                 remat=remat, attention_chunk=attention_chunk)
    # The three-program update does not donate its state: the new state is an output. Of
    # the grammar it reads the [S, V] bool table (the FSM states came with the batch): a
    # fifth of the tables' bytes.
    batch_bytes = rows * (seq * 5 + response_len * 16)
    up["bytes"] = (2 * w.state + math.ceil(batch_bytes / row_split(rows, w.mesh))
                   + grammar_bytes // 5 + 2 * society + ro["out"] + up["temp"])
    programs = {"rollout": int(ro["bytes"]), "score": int(sc["bytes"]),
                "update": int(up["bytes"])}
    working = {"rollout": int(ro["temp"]), "score": int(sc["temp"]),
               "update": int(up["temp"])}
    if donate:
        epoch_temp = _epoch(w, ro["temp"], sc, up["temp"])
        programs["epoch"] = int(w.state + society + grammar_bytes + ro["out"] + epoch_temp
                                + (0 if scan_layers else w.merged))
        working["epoch"] = int(epoch_temp)
    return MemoryEstimate(params=w.params, grads=w.trainable, optimizer=w.opt,
                          reference=w.reference, kv_cache=ro["kv_cache"],
                          activations=int(up["activations"]), programs=programs,
                          working=working)


@dataclasses.dataclass(frozen=True)
class _Weights:
    """The model's per-device shapes and weight bytes that every program's estimate reads."""

    cfg: LlamaConfig
    mesh: Dict[str, int]
    pbytes: int           # storage dtype bytes
    cbytes: int           # compute dtype bytes
    t: int                # tensor axis size
    f: int                # fsdp axis size
    heads_l: int          # attention heads on this device
    kv_l: int             # KV heads on this device
    i_l: int              # MLP width on this device
    params: int           # the policy's weight shards
    layers_local: int     # the decoder layers' shards
    layer_whole: int      # one layer gathered across fsdp
    vocab_f32: int        # one vocab x hidden shard in float32
    vocab_gathered: int   # one vocab x hidden matrix gathered across fsdp (storage dtype)
    trainable: int
    opt: int
    reference: int
    merged: int           # LoRA: the merged kernels (0 without LoRA)
    models: int           # LM heads the scoring pass holds (policy and reference, or one)
    stack: int            # scanned layers: one pass's float32 layer stack (0 unrolled)
    weights: int
    state: int
    lora: bool
    scan_layers: bool


def _div(n: int, k: int) -> int:
    return k if n % k == 0 else 1


def _weights(cfg: LlamaConfig, mesh_shape, *, with_reference: bool, optimizer_slots: int,
             lora_rank: int, optimizer_dtype: Optional[str], scan_layers: bool,
             cohorts: int = 1) -> _Weights:
    """Weight, optimizer and reference bytes per device. LoRA (lora_rank > 0): float32
    adapters on q/k/v/o/gate/up/down are trained, the base is frozen and is the reference, and
    base + A @ B of every adapted kernel is materialised (sharded like the base). Scanned layers
    (`LlamaConfig.scan_layers`): each forward pass stacks one model's layer shards inside the
    program ([L, ...] per kernel); the CPU builds the stack in float32 (a concatenate of
    widened parameters) and keeps it for its float32 dots (LoRA: the merged kernels)."""
    mesh = dict(zip(AXES, (int(s) for s in mesh_shape)))
    pbytes = np.dtype(as_dtype(cfg.param_dtype)).itemsize
    cbytes = np.dtype(as_dtype(cfg.dtype)).itemsize
    obytes = np.dtype(as_dtype(optimizer_dtype)).itemsize if optimizer_dtype else pbytes
    t, f = max(1, mesh["tensor"]), max(1, mesh["fsdp"])
    n_local = params_per_device(cfg, mesh)
    params = n_local * pbytes
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    L, hd = cfg.num_hidden_layers, cfg.head_dim
    # The decoder layers' shards on this device, and one layer gathered across fsdp (the
    # embed dim is what fsdp splits).
    layers_local = params - _vocab_params_per_device(cfg, mesh) * pbytes
    value_head = (h + 1) * 4
    if lora_rank:
        nd, kd = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
        # a + b per kernel, each split along its long axis (`sharding.adapter_shardings`): the
        # hidden side along fsdp, the other along tensor, or along fsdp without tensor.
        def split(n):
            return t if t > 1 and n % t == 0 else _div(n, f)
        per_layer = (7 * h / _div(h, f) + (2 * nd) / split(nd) + (2 * kd) / split(kd)
                     + (3 * i) / split(i))
        trainable = int(L * lora_rank * per_layer * 4 + value_head) * max(1, int(cohorts))
        opt, reference, merged, models = optimizer_slots * trainable, 0, layers_local, 1
    else:
        trainable = params + value_head
        opt = optimizer_slots * (n_local * obytes + value_head)
        reference = params if with_reference else 0
        merged, models = 0, 2 if with_reference else 1
    weights = params + reference + trainable if lora_rank else params + reference + value_head
    return _Weights(
        cfg=cfg, mesh=mesh, pbytes=pbytes, cbytes=cbytes, t=t, f=f,
        heads_l=cfg.num_attention_heads // _div(cfg.num_attention_heads, t),
        kv_l=cfg.num_key_value_heads // _div(cfg.num_key_value_heads, t),
        i_l=i // _div(i, t), params=params, layers_local=layers_local,
        layer_whole=layers_local * _div(h, f) // max(L, 1),
        # One vocab x hidden matrix: the local shard in float32 (the CPU widens bf16 dots) and
        # the bf16 matrix gathered across fsdp.
        vocab_f32=v * h * 4 // (_div(v, t) * _div(h, f)),
        vocab_gathered=v * h * pbytes // _div(v, t),
        trainable=trainable, opt=opt, reference=reference, merged=merged, models=models,
        stack=(merged or layers_local) * 4 // pbytes if scan_layers else 0,
        weights=weights, state=weights + opt, lora=bool(lora_rank), scan_layers=scan_layers)


def _rollout(w: _Weights, *, batch: int, rows: int, prompt_len: int, response_len: int,
             rollout_sharded: bool, attention_chunk: int, social_params,
             prefill_chunk: Optional[int]) -> dict:
    """The rollout's outputs and working set: ticks x batch prompts, each device prefilling and
    decoding its rows. The KV cache of the device's prompts; the prefill's working set (3
    float32 blocks: the larger of a query block's attention scores and the MLP's [rows, C, I/t]
    activations, C the largest prefill chunk; a chunk's queries see the prompt's slots, the
    whole-prompt prefill all prompt + response slots); one more copy of the policy's layer
    shards (LoRA: the merged kernels); the LM head as the CPU computes with it (2 float32
    copies of the local vocab shard, plus the bf16 head gathered whole when fsdp splits it).
    Scanned: the prefill's and the decode step's float32 stacks instead of the layer copy, and
    each pass's LM head gathered."""
    cfg, scan_layers = w.cfg, w.scan_layers
    L, hd = cfg.num_hidden_layers, cfg.head_dim
    seq = prompt_len + response_len
    b_r = math.ceil(batch / row_split(batch, w.mesh)) if rollout_sharded else batch
    ticks = math.ceil(rows / max(batch, 1))
    kv_cache = 2 * L * b_r * seq * w.kv_l * hd * w.cbytes
    if prefill_chunk is None:
        prefill_chunk = SamplingConfig.prefill_chunk
    chunks = SamplingConfig(prefill_chunk=prefill_chunk).prefill_chunks(prompt_len)
    c_rows = max(end - start for start, end in chunks)
    keys = seq if len(chunks) == 1 else prompt_len  # a chunk attends to the filled slots only
    q_rows = attention_chunk if 0 < attention_chunk < c_rows else c_rows
    attn_block = b_r * w.heads_l * q_rows * keys * 4
    if not 0 < attention_chunk < c_rows and not (scan_layers and len(chunks) > 1):
        attn_block *= L  # unchunked: every layer's scores (measured, docs/scaling.md)
    prefill = 3 * max(attn_block, b_r * c_rows * w.i_l * 4)
    lm_head = 2 * w.vocab_f32 + ((2 if scan_layers else 1) * w.vocab_gathered if w.f > 1
                                 else 0)
    traj_row = prompt_len * 5 + response_len * 9  # ids + mask, tokens + logprobs + mask
    records = 0
    if social_params is not None:
        # [T, P, E] engagement deltas + [T, P] slot ids (int32), [T, B, d] embeddings.
        channels = social_params.engagement_channels
        records = ticks * (social_params.post_capacity * 4 * (channels + 1)
                           + batch * social_params.embed_dim * 4)
    out = ticks * b_r * traj_row + records
    if scan_layers:
        temp = kv_cache + prefill + 2 * w.stack + lm_head
    else:
        temp = kv_cache + prefill + (w.merged or w.layers_local) + lm_head
    return {"out": out, "temp": temp, "kv_cache": kv_cache}


def _scoring(w: _Weights, *, rows: int, seq: int, response_len: int, score_micro_batch: int,
             score_sharded: bool, attention_chunk: int, with_reference: bool) -> dict:
    """The scoring pass's working set (micro-batches of score_micro_batch rows): per model, the
    LM head in float32; the MLP activations of one micro-batch; when the rows lie on the fsdp
    axis, each model's vocab matrices gathered whole and a copy of one model's layer shards
    (tied embeddings: each model's embedding transposed for the head); LoRA: the merged
    kernels. Scanned: 4 x the bf16 layer shards (the policy's and the reference's float32
    stacks, or, rows off fsdp, both bf16 stacks and one float32) instead of the layer copy."""
    cfg = w.cfg
    at_once = min(rows, int(score_micro_batch)) if score_micro_batch else rows
    split_s = row_split(at_once, w.mesh) if score_sharded and at_once * seq > cfg.hidden_size \
        else 1
    b_s = math.ceil(at_once / split_s)
    q_s = attention_chunk if 0 < attention_chunk < seq else seq
    acts_s = 3 * max(b_s * seq * w.i_l * 4, b_s * w.heads_l * q_s * seq * 4)
    passes = 2 if (with_reference or w.lora) else 1  # the policy's, the reference's
    rows_on_fsdp = w.f > 1 and split_s % w.f == 0
    if w.scan_layers:
        temp = w.models * w.vocab_f32 + acts_s + passes * w.stack
        if rows_on_fsdp or cfg.tie_word_embeddings:
            temp += w.models * w.vocab_gathered
    else:
        temp = w.models * w.vocab_f32 + acts_s + w.merged
        if rows_on_fsdp:
            # Rows on fsdp: XLA gathers the weights (each model's vocab matrices whole, and a
            # copy of one model's layer shards) rather than moving the activations.
            temp += w.models * w.vocab_gathered + w.layers_local
        elif cfg.tie_word_embeddings:
            temp += w.models * w.vocab_gathered  # each model's embedding, transposed
    return {"temp": temp, "rows_on_fsdp": rows_on_fsdp,
            "rows_d": math.ceil(rows / row_split(rows, w.mesh))}


def _update(w: _Weights, *, rows: int, seq: int, response_len: int,
            train_micro_batch: Optional[int], update_sharded: bool,
            minibatch_rows: Optional[int], logits_chunk_bytes: int, remat: bool,
            attention_chunk: int) -> dict:
    """The update's working set: micro-batches of mb_d rows per device, minibatch_rows per
    optimizer step. The layers keep a micro-batch's rows split (`llama._weights_move`) only
    when its tokens outnumber the hidden size; smaller ones are XLA's choice (measured: every
    device computes all rows). The optimizer's loop state (accumulating micro-batches: the new
    parameters, both moments and the gradient accumulator, 4 x the trainable shards; else one
    gradient), the saved layer inputs (remat, float32), the layer gradients (below, by where
    the rows lie) and the logits chunk."""
    cfg, f = w.cfg, w.f
    h, v, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    mb = int(train_micro_batch or rows)
    split_u = row_split(mb, w.mesh) if update_sharded and mb * seq > h else 1
    mb_d = math.ceil(mb / split_u)
    rows_on_fsdp = f > 1 and split_u % f == 0
    minibatch = int(minibatch_rows or mb)
    carry = (4 if minibatch > mb else 1) * w.trainable
    logits = min(logits_chunk_bytes, mb_d * response_len * (v // _div(v, w.t)) * 4)
    if remat:
        # Each layer's input (float32) and the backward's attention blocks (3 float32 query
        # blocks of scores; unchunked: every layer keeps ~1.16 score tensors besides).
        # Scanned with the rows off fsdp: the stacked inputs [L, rows, T, H] keep their
        # hidden dim split across fsdp.
        h_saved = h // _div(h, f) if w.scan_layers and not rows_on_fsdp else h
        saved = L * mb_d * seq * h_saved * 4
        q_u = attention_chunk if 0 < attention_chunk < seq else seq
        attn_u = 3 * mb_d * w.heads_l * q_u * seq * 4
        if not 0 < attention_chunk < seq:
            saved += int(L * 1.16 * mb_d * w.heads_l * seq * seq * 4)
    else:
        # Korthikanti et al. (2022): 34*T*B*H at 16 bits per layer besides the attention;
        # the attention's [B, heads, T, T] scores as XLA keeps them on the CPU (bf16 widened:
        # float32 either way): 13 bytes per score per layer, and 2 float32 score tensors of
        # the layer in the backward (the tiny preset's update, 2 and 4 layers, T = 520 and
        # 1032: the working set within 10% of XLA's temp; Korthikanti's 5 bytes per score at
        # 16 bits gave two thirds of it).
        saved = (L * 34 * seq * mb_d * h // w.t * w.cbytes // 2
                 + (13 * L + 8) * w.heads_l * seq * seq * mb_d)
        attn_u = 0
    layer_grads, vocab_u = _layer_grads(w, rows_on_fsdp, mb_d, seq)
    activations = saved + attn_u + logits
    if w.scan_layers:
        # The backward (the gradient accumulator: one trainable tree) and the optimizer step
        # (`carry`: new parameters, both moments, the accumulator) peak apart.
        temp = max(carry, w.trainable + layer_grads + vocab_u + activations)
    else:
        temp = carry + layer_grads + vocab_u + activations
    return {"temp": temp, "activations": activations}


def _layer_grads(w: _Weights, rows_on_fsdp: bool, mb_d: int, seq: int) -> Tuple[int, int]:
    """(layer gradients, vocab matrices) bytes of the update's backward."""
    L, f = w.cfg.num_hidden_layers, w.f
    if w.scan_layers:
        # Scanned: each layer's gradients are reduce-scattered inside its iteration of the
        # backward scan and written into stacked bf16 gradients (the layer shards once; LoRA:
        # the merge is outside the scan, every layer's base and merged kernels widened to
        # float32 for it), beside the policy's float32 stack; the LM head and embedding as
        # in the unrolled program (gathered whole when the rows lie on fsdp).
        layer_grads = 2 * 2 * w.merged if w.lora else w.layers_local
        layer_grads += w.stack
        vocab_u = 2 * (w.vocab_gathered + w.vocab_f32) if rows_on_fsdp else 2 * w.vocab_f32
    elif w.lora:
        # Every layer's base widened for the merge and merged kernels widened for the dots
        # (float32) beside the bf16 merge, and one layer's float32 gradient in flight; the
        # LM head and the embedding (frozen, whole) in float32.
        layer_grads = 2 * 2 * w.merged + w.merged + 2 * w.layer_whole
        vocab_u = 2 * w.vocab_f32
    elif rows_on_fsdp:
        # Full-size float32 gradients of every layer (reduce-scattered after the backward),
        # ~1.5 per layer as XLA allocates them; each vocab matrix gathered whole (bf16)
        # beside its float32 shard.
        layer_grads = 3 * L * w.layer_whole
        vocab_u = 2 * (w.vocab_gathered + w.vocab_f32)
    elif f > 1:
        # Rows off fsdp: float32 gradient shards, and the MLP's float32 activations
        # all-reduced across fsdp (the dots contract over the split embed dim), per layer.
        layer_grads = L * (2 * w.layer_whole // f + mb_d * seq * w.i_l * 4)
        vocab_u = 2 * w.vocab_f32
    else:
        # Weights whole on the device: float32 gradients of every layer.
        layer_grads = 2 * w.layers_local
        vocab_u = 2 * w.vocab_f32
    return layer_grads, vocab_u


def _epoch(w: _Weights, rollout_temp: int, sc: dict, update_temp: int) -> int:
    """The one-program epoch's working set (state donated: the new state reuses it): the
    largest of the three phases'. LoRA: the rollout's merged kernels stay live (XLA shares them
    with the update's first merge). Scanned: the merged kernels are the stacks (no copy beside
    them); where scoring builds bf16 stacks (its rows off fsdp), the rollout's two passes keep
    a bf16 stack each beside the float32 one (XLA shares it with scoring)."""
    if w.scan_layers:
        bf16_stacks = 2 * (w.merged or w.layers_local) if not sc["rows_on_fsdp"] else 0
        return max(rollout_temp + bf16_stacks, sc["temp"], update_temp)
    return max(rollout_temp, sc["temp"], update_temp)


def _vocab_params_per_device(cfg: LlamaConfig, mesh: Dict[str, int]) -> int:
    """Parameter count of the embedding (and untied LM head) held by one device."""
    shapes = _param_shapes(cfg)
    return sum(count * math.prod(shape) // _shard_factor(shape, names, mesh)
               for name, (shape, names, count) in shapes.items()
               if name in ("embed_tokens", "lm_head"))


def check_fits(est: MemoryEstimate, device_bytes: int, headroom: float = 0.9) -> bool:
    """Log a warning (and return False) when the estimate exceeds headroom x device memory."""
    if est.total > headroom * device_bytes:
        logging.warning("estimated %.2f GiB per device exceeds %.0f%% of the %.2f GiB available;"
                        " shard more (mesh.fsdp/tensor), use LoRA, remat, or smaller batches.\n%s",
                        est.total / GiB, headroom * 100, device_bytes / GiB, est.table())
        return False
    return True


def check_machine(est: MemoryEstimate, devices: int = 1, what: str = "the run") -> None:
    """Refuse (ValueError, one line) an estimate beyond this machine's memory; warn above 90%
    of it (`check_fits`). The memory is one device's (`machine_memory`: GPU/TPU, against the
    per-device estimate) or, on the CPU, the RAM its `devices` (the mesh's local devices, all
    in this process) share, against devices x the estimate. `what` names the config keys that
    size the run, for the message."""
    total, kind, per_device = machine_memory()
    devices = 1 if per_device else max(1, int(devices))
    need = est.total * devices
    if need > total:
        each = f" ({devices} CPU devices x {est.total / GiB:.1f} GiB)" if devices > 1 else ""
        per = " per device" if per_device else ""
        top = max(est.programs, key=est.programs.get) if est.programs else "total"
        raise ValueError(
            f"{what}: the epoch needs ~{need / GiB:.1f} GiB{per}{each} by memory.estimate "
            f"(largest program: {top}; parameters {est.params / GiB:.1f}, optimizer "
            f"{est.optimizer / GiB:.1f}, KV cache {est.kv_cache / GiB:.1f} GiB), more than this "
            f"machine's {total / GiB:.1f} GiB of {kind}; shard more (mesh.shape), train LoRA "
            f"adapters (rl.lora_rank), set model.remat / model.attention_chunk / rl.micro_batch, "
            f"or act with fewer agents per tick (agents.active_per_tick)")
    check_fits(est, total // devices)


def device_memory_bytes() -> Optional[int]:
    """Memory of the first local device, when the backend reports it (GPU/TPU)."""
    stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
    return None if not stats else stats.get("bytes_limit")


def host_memory_bytes() -> int:
    """This machine's RAM as this process may use it: the physical memory
    (`os.sysconf('SC_PHYS_PAGES') * SC_PAGE_SIZE`, else /proc/meminfo's MemTotal), capped by the
    cgroup's limit when a container sets one (cgroup v2 `memory.max`, v1
    `memory.limit_in_bytes`)."""
    total = 0
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        try:
            with open("/proc/meminfo") as f:
                total = next(int(line.split()[1]) * 1024 for line in f
                             if line.startswith("MemTotal:"))
        except (OSError, StopIteration, ValueError, IndexError):
            total = 0
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = int(f.read().strip())  # "max" (no limit) raises ValueError
        except (OSError, ValueError):
            continue
        if 0 < limit < (total or limit + 1):
            total = limit
    return int(total)


def machine_memory() -> Tuple[int, str, bool]:
    """(bytes, what, per_device): the memory of one local device when the backend reports it
    (`device_memory_bytes`: GPU/TPU, per_device True), else this machine's RAM
    (`host_memory_bytes`: the CPU backend, whose devices all share it, per_device False).
    Starts the backend if it is not started yet."""
    device = device_memory_bytes()
    if device:
        return int(device), "device memory", True
    return host_memory_bytes(), "RAM", False


def encode_bytes(cfg: LlamaConfig, rows: int, length: int) -> int:
    """Working set of one forward pass without a KV cache over [rows, length] tokens on one
    device: the set-up's text-bank pass (`social.text_bank.embed_rows`: pooled states of the
    interest descriptions and personas, `rows` = its chunk of up to 64 texts padded to the
    longest). Four float32 blocks of attention scores [rows, heads, q, length] (q the query
    block, `attention_chunk`, else the whole length) and the MLP's and hidden states'
    activations. Against XLA's temp for the pass on the CPU: tiny at [64, 1024] +1%, with
    256-query blocks +18%; small_20m at [16, 512] +6%; demo.py:smoke with a 6,240-token persona
    149.3 GiB estimated, 149.0 GiB allocated (the OOM it ended in)."""
    rows, length = int(rows), int(length)
    chunk = int(cfg.attention_chunk)
    q = chunk if 0 < chunk < length else length
    scores = 4 * rows * cfg.num_attention_heads * q * length * 4
    acts = 2 * rows * length * (cfg.intermediate_size + cfg.hidden_size) * 4
    return int(scores + acts)
