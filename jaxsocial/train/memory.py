"""Bytes per device before a run starts, per compiled program of the epoch (rollout, scoring,
PPO update): parameters, reference, optimizer, gradients, KV cache, activations -- for a Llama
config, a (data, fsdp, tensor) mesh and the rollout/update shapes.

Sharding follows `jaxsocial.train.sharding.LOGICAL_AXIS_RULES` (fsdp shards the embed axis,
tensor shards heads/mlp/vocab). The activation terms are calibrated on XLA's own
`memory_analysis()` of the compiled programs at Llama-3-8B shapes (`benchmarks/aot_memory.py`,
table in docs/scaling.md; agreement within 7% at 32 layers) and checked on small shapes by
tests/test_aot_memory.py; without remat the per-layer count of Korthikanti et al. (2022) is used.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Sequence

import jax
import numpy as np
from absl import logging

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

    @property
    def components(self) -> Dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "programs"}

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
             logits_chunk_bytes: int = 64 * 2 ** 20, rollout_sharded: bool = False,
             score_sharded: bool = False, update_sharded: bool = False,
             minibatch_rows: Optional[int] = None,
             score_micro_batch: int = 0, attention_chunk: int = 0) -> MemoryEstimate:
    """Per-device bytes of the epoch's three programs (rollout, scoring, PPO update).

    batch: prompts generated at once (global, the acting agents); trajectories: rows scored
    and trained per epoch (global, default batch); train_micro_batch: rows per gradient step
    (global, default trajectories); optimizer_slots: 2 for Adam(W), whose moments (and the
    gradients) have the parameters' dtype unless optimizer_dtype says otherwise (optax's
    default); lora_rank > 0: float32 adapters are trained, the base is frozen and is the
    reference. donate: the update's state is donated (its outputs reuse the argument buffers).
    rollout_sharded / score_sharded: whether the rollout's prompts / the scored trajectories
    are split along the data axes (as the loop does it; False: each device holds all rows).
    logits_chunk_bytes: the largest [rows, chunk, V] float32 logits block
    (`generation.scoring.token_stats`).
    update_sharded: whether the update's rows stay split along the data axes (False: as
    measured, each device computes the whole micro-batch); minibatch_rows: rows per optimizer
    step (global, default train_micro_batch); score_micro_batch > 0: the scoring pass runs
    that many rows at a time (`policy.score_batch` with `micro_batch`), 0: all at once.
    attention_chunk > 0: attention runs in query blocks of that many (`LlamaConfig`), so one
    block's [rows, heads, chunk, S] scores are live instead of every layer's [rows, heads, T, S].

    Model (checked against XLA's memory_analysis of the compiled programs by
    tests/test_aot_memory.py): run state = policy + reference + optimizer; the rollout adds
    the KV cache and one prefill layer's temporaries (attention scores in float32), the
    scoring pass one layer's temporaries over all trajectories, and the update the new state
    (unless donated), two gradient trees, the saved layer inputs (with remat) or all
    activations (Korthikanti et al. 2022: 34*T*B*H + 5*heads*T^2*B at 16 bits) and the logits
    block.
    """
    mesh = dict(zip(AXES, (int(s) for s in mesh_shape)))
    pbytes = np.dtype(as_dtype(cfg.param_dtype)).itemsize
    cbytes = np.dtype(as_dtype(cfg.dtype)).itemsize
    obytes = np.dtype(as_dtype(optimizer_dtype)).itemsize if optimizer_dtype else pbytes
    t = max(1, mesh["tensor"])
    data = mesh["data"] * mesh["fsdp"]
    n_local = params_per_device(cfg, mesh)
    params = n_local * pbytes
    h, i = cfg.hidden_size, cfg.intermediate_size
    L, hd = cfg.num_hidden_layers, cfg.head_dim
    # One decoder layer's weights, whole (as gathered across fsdp when it runs).
    layer_bytes = (n_local * mesh["fsdp"] - 2 * cfg.vocab_size * h) // max(L, 1) * pbytes
    divides = lambda n: n % t == 0  # noqa: E731
    heads_l = cfg.num_attention_heads // (t if divides(cfg.num_attention_heads) else 1)
    kv_l = cfg.num_key_value_heads // (t if divides(cfg.num_key_value_heads) else 1)
    value_head = (h + 1) * 4
    if lora_rank:
        # Adapters (float32, replicated) on q/k/v/o/gate/up/down; base frozen = reference.
        nd, kd = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
        per_layer = (h + nd) + 2 * (h + kd) + (nd + h) + 3 * (h + i)  # a + b per kernel
        trainable = L * lora_rank * per_layer * 4 + value_head
        opt = optimizer_slots * trainable
        reference = 0
        merged = params  # base + A @ B materialised for the forward passes
    else:
        trainable = params + value_head
        opt = optimizer_slots * (n_local * obytes + value_head)
        reference = params if with_reference else 0
        merged = 0
    grads = trainable
    state = params + reference + opt + (trainable if lora_rank else value_head)
    seq = prompt_len + response_len
    rows = int(trajectories or batch)

    # Rollout: KV cache + the prefill's attention scores, float32 [b, heads, Lp, S] twice
    # (scores and probabilities) per layer: XLA's schedule of the unrolled layers keeps every
    # layer's (measured by benchmarks/aot_memory.py) (+ LoRA's merged weights).
    b_r = math.ceil(batch / data) if rollout_sharded else batch
    kv_cache = 2 * L * b_r * seq * kv_l * hd * cbytes
    if 0 < attention_chunk < prompt_len:
        # One query block live at a time (a loop), measured at ~7 float32 block-sized
        # temporaries (8B on (1, 8, 1), chunk 256: 31.7 GiB at 1 layer; one calibration point).
        prefill = 7 * b_r * heads_l * attention_chunk * seq * 4
    else:
        prefill = L * 2 * b_r * heads_l * prompt_len * seq * 4
    traj_row = prompt_len * 5 + response_len * 9  # ids + mask, tokens + logprobs + mask
    rollout_out = rows * traj_row
    rollout = state + kv_cache + merged + prefill + rollout_out

    # Scoring: policy and reference forwards over the rows scored at once (all trajectories,
    # or score_micro_batch of them): one layer's attention temporaries (4 float32
    # [rows, heads, S, S]) + every layer's hidden states of both models (split along embed by
    # fsdp).
    at_once = min(rows, int(score_micro_batch)) if score_micro_batch else rows
    b_s = math.ceil(at_once / data) if score_sharded else at_once
    f = mesh["fsdp"] if h % mesh["fsdp"] == 0 else 1
    q_rows = attention_chunk if 0 < attention_chunk < seq else seq
    layer_tmp = 4 * b_s * heads_l * q_rows * seq * 4 + L * 2 * b_s * seq * h * cbytes // f
    logits_blk = min(logits_chunk_bytes, b_s * response_len * cfg.vocab_size * 4)
    batch_bytes = rows * (seq * 5 + response_len * 16)
    # The optimizer state is not an input of scoring (jit drops unused arguments).
    score = (params + reference + value_head + merged + rollout_out + batch_bytes + layer_tmp
             + 2 * logits_blk)
    if score_micro_batch and mesh["fsdp"] > 1:
        # Chunked scoring is a loop whose weight all-gathers are loop-invariant: XLA hoists
        # them, keeping both models' embedding and LM head gathered and, per layer, about
        # half a layer's weights (measured by benchmarks/aot_memory.py --programs=score at
        # 8B on (1, 8, 1): 15.5 GiB per device; one calibration point).
        models = 2 if (with_reference and not lora_rank) else 1
        score += models * 2 * cfg.vocab_size * h * pbytes // t + L * layer_bytes // 2

    # Update: the new state (unless donated), gradients (accumulator + one micro-batch's),
    # the activations and the logits block. Measured (benchmarks/aot_memory.py, 8B shapes on
    # (1, 8, 1)): with remat, each layer keeps ~1.16 float32 attention-score tensors of the
    # micro-batch plus the layer inputs of the minibatch, and the backward's working set is
    # ~2.7 score tensors -- with the *global* row counts: the minibatch shuffle (a gather of
    # the data-sharded batch) leaves every device with all rows.
    mb = int(train_micro_batch or rows)
    minibatch = int(minibatch_rows or mb)
    if not update_sharded:
        mb_d, minibatch_d = mb, minibatch
    else:
        mb_d, minibatch_d = math.ceil(mb / data), math.ceil(minibatch / data)
    scores_t = heads_l * seq * seq * 4  # one float32 attention-score row [heads, S, S]
    if remat and 0 < attention_chunk < seq:
        # Checkpointed query blocks: no layer keeps its scores; measured (8B on (1, 8, 1),
        # chunk 256, micro-batch 8): ~2 GiB per layer, about 5x one layer's full (gathered)
        # weights: weights and gradients of the layer in flight (one calibration point).
        act = L * 5 * layer_bytes + 3 * mb_d * heads_l * attention_chunk * seq * 4
    elif remat:
        act = (L * (1.16 * mb_d * scores_t + minibatch_d * seq * h * cbytes)
               + 2.7 * mb_d * scores_t)
    else:
        act = L * (34 * seq * mb_d * h // t + 5 * heads_l * seq * seq * mb_d) * cbytes // 2
    act = int(act)
    mb = mb_d
    # One [rows, chunk, V] float32 logits block: log p = z[token] - logsumexp(z) fuses the
    # exp and the sum into one reduction, and the backward's dz takes z's place (XLA, 20M on
    # (1, 8, 1): 3 blocks with the old materialised log-softmax, 1 since).
    logits = min(logits_chunk_bytes, mb * response_len * cfg.vocab_size * 4)
    activations = act + logits
    new_state = 0 if donate else (trainable + opt)
    # Sharded weights are all-gathered where used: the largest matrix (embedding / LM head,
    # vocab split by tensor only) and its full gradient before the reduce-scatter.
    big = cfg.vocab_size * h * pbytes // (t if cfg.vocab_size % t == 0 else 1)
    gather = 2 * big if mesh["fsdp"] > 1 else 0
    update = (state + math.ceil(batch_bytes / data) + new_state + 2 * grads + merged
              + activations + gather)
    programs = {"rollout": int(rollout), "score": int(score), "update": int(update)}
    if donate:
        programs["epoch"] = int(_fused_epoch(
            cfg, mesh, state=state + merged, batch=batch, rows=rows, prompt_len=prompt_len,
            seq=seq, micro=int(train_micro_batch or rows), attention_chunk=attention_chunk,
            response_len=response_len, pbytes=pbytes, cbytes=cbytes,
            logits_chunk_bytes=logits_chunk_bytes, lora=bool(lora_rank)))
    return MemoryEstimate(params=params, grads=grads, optimizer=opt, reference=reference,
                          kv_cache=kv_cache, activations=activations, programs=programs)


def _fused_epoch(cfg: LlamaConfig, mesh: Dict[str, int], *, state: int, batch: int, rows: int,
                 prompt_len: int, seq: int, micro: int, attention_chunk: int, response_len: int,
                 pbytes: int, cbytes: int, logits_chunk_bytes: int, lora: bool) -> int:
    """Per-device bytes of the one-program epoch (state donated), the way XLA's CPU backend
    (memory-minimising scheduler) counts it: the run state, plus the larger of the rollout's
    and the update's working sets, plus what every layer adds.

    Calibrated on `benchmarks/aot_memory.py --programs=epoch --layers=1,2` at three points
    (8B on (1, 8, 1) and (4, 16, 1), 1B on one device: docs/scaling.md); the per-row terms
    count rows split as the row constraints split them (`row_split`)."""
    t = max(1, mesh["tensor"])
    heads_l = cfg.num_attention_heads // (t if cfg.num_attention_heads % t == 0 else 1)
    kv_l = cfg.num_key_value_heads // (t if cfg.num_key_value_heads % t == 0 else 1)
    h, L = cfg.hidden_size, cfg.num_hidden_layers
    # One vocab x hidden matrix in float32 (the embedding / LM head as the CPU computes with
    # it: bf16 dots are widened), split only by tensor.
    vocab_f32 = cfg.vocab_size * h * 4 // (t if cfg.vocab_size % t == 0 else 1)
    q_rows = attention_chunk if 0 < attention_chunk < prompt_len else prompt_len
    # Rollout: each device prefills its share of the prompts (b_r rows); ~3 float32 attention
    # blocks [b_r, heads, chunk, S] are live, beside the LM head.
    b_r = math.ceil(batch / row_split(batch, mesh))
    rollout = 3 * b_r * heads_l * q_rows * seq * 4 + vocab_f32
    # Update: one micro-batch (mb_d rows per device): its attention blocks and logits chunks.
    # When its rows lie on fsdp -- the axis that splits the weights' embed dim -- the LM head
    # and the embedding are gathered whole with their gradient (3 float32 vocab matrices);
    # rows on other axes leave them sharded (XLA moves the activations instead).
    split = row_split(micro, mesh)
    mb_d = math.ceil(micro / split)
    rows_on_fsdp = mesh["fsdp"] > 1 and split % mesh["fsdp"] == 0
    update = (3 * mb_d * heads_l * q_rows * seq * 4
              + 3 * min(logits_chunk_bytes, mb_d * response_len * cfg.vocab_size * 4)
              + (3 * vocab_f32 if rows_on_fsdp and not lora else 0))
    # Per layer: the KV cache of the device's prompts, one more copy of the layer's trainable
    # state on the device (parameters + two Adam moments: the guarded step's new values), and
    # the micro-batch's saved layer input (remat, float32).
    layer_local = (params_per_device(cfg, mesh)
                   - _vocab_params_per_device(cfg, mesh)) * pbytes // max(L, 1)
    per_layer = (2 * b_r * seq * kv_l * cfg.head_dim * cbytes
                 + (0 if lora else 3 * layer_local)
                 + mb_d * seq * h * 4)
    trajectories = math.ceil(rows / row_split(rows, mesh)) * (prompt_len * 5 + response_len * 9)
    return state + max(rollout, update) + L * per_layer + trajectories


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


def device_memory_bytes() -> Optional[int]:
    """Memory of the first local device, when the backend reports it (GPU/TPU)."""
    stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
    return None if not stats else stats.get("bytes_limit")
