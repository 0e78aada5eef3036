"""The RL view of a Llama: sampled-token log-probs, reference log-probs and values.

A rollout row is prompt [P] (left-padded) + response [R] (right-padded). The logits at
sequence position P - 1 + t predict response token t, and the value of the state before
token t is read from the hidden state at the same position. Log-probs are taken under the
*sampling* distribution (`jaxsocial.generation.sampling.log_probs`: grammar mask,
temperature, top-k, top-p) — the same function the generator uses, so the first PPO ratio
on a fresh rollout is 1. They are computed by `generation.scoring` (the one re-scoring path,
which `generation.recompute_logprobs` also runs): in chunks of response positions
(`scoring.token_stats`: `lax.scan` + remat), so no [B, R, V] logits array exists in scoring or
in the update; the grammar mask of each step is rebuilt from the trajectory's FSM states and
the grammar tables.

Value modes: "head" (a scalar head on the policy trunk's final hidden states, trained
through the trunk), "critic" (a separate Llama trunk + head), "none" (GRPO).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx, struct

from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.generation import sampling as sampling_lib
from jaxsocial.generation import scoring
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl.buffer import Trajectory

VALUE_MODES = ("head", "critic", "none")


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyDef:
    """Static description of the trainable policy (hashable by identity; build it once).

    graphdef: nnx graphdef of the policy Llama; critic_graphdef: of the critic (value_mode
    "critic"); lora: a `lora.LoraConfig` when only adapters are trained (reference = base;
    the forward keeps them unmerged: `lora.adapt`).
    """

    graphdef: Any
    value_mode: str = "head"
    critic_graphdef: Any = None
    lora: Any = None
    value_stop_gradient: bool = False  # head mode: value loss does not reach the trunk
    compute_dtype: str = "float32"      # the policy's compute dtype (old-log-prob reuse rule)

    @property
    def has_values(self) -> bool:
        return self.value_mode != "none"


@struct.dataclass
class PolicyEval:
    """logprobs [B, R] float32 (sampling distribution); values [B, R] float32 or None;
    entropy [B, R] float32 (of the sampling distribution) or None."""

    logprobs: jax.Array
    values: Optional[jax.Array] = None
    entropy: Optional[jax.Array] = None


def _value_head(hidden_size: int) -> dict:
    # Zero init: V = 0 at the start, so the first advantages are pure returns.
    return {"kernel": jnp.zeros((hidden_size,), jnp.float32), "bias": jnp.zeros((), jnp.float32)}


def init_policy(model, key=None, *, value_mode: str = "head", critic=None, lora=None,
                value_stop_gradient: bool = False):
    """Split a Llama into (PolicyDef, trainable params, frozen reference params).

    model: `llama.Llama`; critic: a second Llama for value_mode="critic" (default: a copy of
    the policy's initial weights); lora: `lora.LoraConfig` to train adapters only (needs key).
    params = {"policy": weights (or adapters), "value": {"head": ..., ["trunk": ...]} or None};
    ref_params = the policy's initial weights (pure dict).
    """
    if value_mode not in VALUE_MODES:
        raise ValueError(f"value_mode={value_mode!r}; choose one of {VALUE_MODES}")
    graphdef, state = nnx.split(model)
    weights = nnx.to_pure_dict(state)
    hidden = model.config.hidden_size
    critic_graphdef = None
    if value_mode == "head":
        value = {"head": _value_head(hidden)}
    elif value_mode == "critic":
        if critic is None:
            critic_graphdef, critic_weights = graphdef, weights
        else:
            critic_graphdef, cstate = nnx.split(critic)
            critic_weights = nnx.to_pure_dict(cstate)
            hidden = critic.config.hidden_size
        # A separate buffer tree: the critic trunk trains independently of the policy.
        value = {"head": _value_head(hidden), "trunk": jax.tree.map(jnp.copy, critic_weights)}
    else:
        value = None
    if lora is not None:
        if key is None:
            raise ValueError("init_policy with lora needs a PRNG key for the adapters")
        policy = lora_lib.init_adapters(weights, lora, key)
    else:
        policy = jax.tree.map(jnp.copy, weights)
    pdef = PolicyDef(graphdef=graphdef, value_mode=value_mode, critic_graphdef=critic_graphdef,
                     lora=lora, value_stop_gradient=value_stop_gradient,
                     compute_dtype=jnp.dtype(model.config.dtype).name)
    return pdef, {"policy": policy, "value": value}, weights


def policy_weights(pdef: PolicyDef, params, ref_params):
    """The weights the policy forward uses: with LoRA, the base with every adapted kernel an
    unmerged `Adapted` (x @ W + scale * (x @ A) @ B); without, the trained weights."""
    if pdef.lora is not None:
        return lora_lib.adapt(ref_params, params["policy"], pdef.lora)
    return params["policy"]


def _forward(graphdef, weights, batch: Trajectory, group: int = 0):
    """-> (hidden [B, R, H] of the response positions, unembedding matrix [H, V]).

    group > 1: rows in contiguous groups of `group` sharing a prompt run the prompt's forward
    once per group (`scoring.response_hidden_auto`: checked at run time, same values)."""
    return scoring.response_hidden_auto(nnx.merge(graphdef, weights), batch.prompt_tokens,
                                        batch.prompt_mask, batch.response_tokens,
                                        batch.response_mask, group)


def _group(cfg, rows: int) -> int:
    """The static prompt group of `cfg` for a batch of `rows` rows (0 = no sharing)."""
    g = int(getattr(cfg, "prompt_group", 0) or 0)
    return g if g > 1 and rows % g == 0 else 0


def _values(head, hidden):
    return hidden.astype(jnp.float32) @ head["kernel"] + head["bias"]


def _grammar_states(batch: Trajectory, grammar):
    if grammar is None:
        if batch.fsm_states is not None:
            raise ValueError("the batch carries fsm_states but no grammar was passed: pass the "
                             "grammar the rollout sampled under (grammar=...)")
        return None
    if batch.fsm_states is not None:
        return batch.fsm_states
    return grammar_lib.step_states(grammar, batch.response_tokens, batch.response_mask)


def evaluate(pdef: PolicyDef, params, ref_params, batch: Trajectory, cfg, *,
             with_values: bool = True, with_entropy: bool = False,
             entropy_grad: bool = False, grammar=None) -> PolicyEval:
    """One policy forward over prompt + response -> PolicyEval, each [B, R] float32.

    cfg supplies the sampling distribution (temperature, top_k, top_p) and `logits_chunk`
    (0 = auto); `grammar` (a `generation.grammar.Grammar`, passed as a traced argument) with
    batch.fsm_states [B, R] the grammar masks (replayed from the tokens when fsm_states is
    None). Log-probs and entropy come from `token_stats` (chunked, no [B, R, V] array).
    Entropy is of the same (masked, tempered, truncated) distribution; it is differentiable
    only with entropy_grad=True (otherwise it is a logged metric and costs no backward pass).
    cfg.prompt_group > 1 (dividing B): rows in contiguous groups of that many that share a
    prompt run the prompt's forward once per group (checked at run time; same values).
    """
    p, r = batch.prompt_len, batch.response_len
    if p < 1:
        raise ValueError("the prompt must have at least one slot (the token before the response)")
    scfg = sampling_config(cfg, r)
    states = _grammar_states(batch, grammar)
    group = _group(cfg, batch.batch_size)
    hidden, w = _forward(pdef.graphdef, policy_weights(pdef, params, ref_params), batch, group)
    logprobs, entropy = scoring.token_stats(hidden, w, batch.response_tokens, scfg,
                                            grammar=grammar, states=states, chunk=_chunk(cfg),
                                            with_entropy=with_entropy, entropy_grad=entropy_grad)
    values = None
    if with_values and pdef.has_values:
        if pdef.value_mode == "head":
            if pdef.value_stop_gradient:
                hidden = jax.lax.stop_gradient(hidden)
        else:
            hidden, _ = _forward(pdef.critic_graphdef, params["value"]["trunk"], batch, group)
        values = _values(params["value"]["head"], hidden)
    return PolicyEval(logprobs=logprobs, values=values, entropy=entropy)


def values_only(pdef: PolicyDef, params, ref_params, batch: Trajectory, cfg) -> jax.Array:
    """Values [B, R] float32 with no log-probs (no LM head): the policy trunk's forward
    (value_mode "head") or the critic's ("critic"). Needs pdef.has_values."""
    group = _group(cfg, batch.batch_size)
    if pdef.value_mode == "head":
        hidden, _ = _forward(pdef.graphdef, policy_weights(pdef, params, ref_params), batch,
                             group)
    else:
        hidden, _ = _forward(pdef.critic_graphdef, params["value"]["trunk"], batch, group)
    return _values(params["value"]["head"], hidden)


def reference_logprobs(pdef: PolicyDef, ref_params, batch: Trajectory, cfg,
                       grammar=None) -> jax.Array:
    """Log-probs [B, R] of the response under the frozen reference (same sampling dist)."""
    r = batch.response_len
    states = _grammar_states(batch, grammar)
    hidden, w = _forward(pdef.graphdef, ref_params, batch, _group(cfg, batch.batch_size))
    return scoring.token_stats(hidden, w, batch.response_tokens, sampling_config(cfg, r),
                               grammar=grammar, states=states, chunk=_chunk(cfg))[0]


def old_logprobs_source(pdef: PolicyDef, cfg, have_rollout: bool) -> str:
    """The static rule for where `score_batch` takes the old log-probs: "rollout" or "rescore".

    cfg.old_logprobs (default "auto"):
      "rescore": a policy forward re-scores the response (the reference in tests);
      "rollout": the rollout's own sampled-token log-probs (ValueError when none are passed);
      "auto":    the rollout's when they are passed and exact — the policy computes in
                 float32 (`pdef.compute_dtype`), where the generator's log-probs (cached
                 decode, same `sampling.log_probs` distribution and grammar masks) equal a
                 re-scoring to ~1e-6 — otherwise a re-scoring (bf16 decode and a bf16
                 full forward round differently).
    """
    mode = getattr(cfg, "old_logprobs", "auto")
    if mode == "rescore":
        return "rescore"
    if mode == "rollout":
        if not have_rollout:
            raise ValueError("old_logprobs='rollout' needs the rollout's log-probs: pass "
                             "score_batch(..., rollout_logprobs=...)")
        return "rollout"
    if mode != "auto":
        raise ValueError(f"old_logprobs={mode!r}; choose 'auto', 'rollout' or 'rescore'")
    return "rollout" if have_rollout and pdef.compute_dtype == "float32" else "rescore"


def head_values(params, hidden: jax.Array) -> jax.Array:
    """Values [B, R] float32 of final-normed hidden states [B, R, H] through the value head
    (value_mode "head"). With the generator's `step_hidden` these are the old values
    `score_batch` takes from the rollout (`rl.old_values="rollout"`)."""
    return _values(params["value"]["head"], hidden)


def uses_reference(cfg) -> bool:
    """Whether the KL to the reference is charged (kl_coef > 0, or PPO's adaptive controller).
    Without it `score_batch` runs no reference forward, as TRL does at beta = 0: the reference
    log-probs it returns are the old log-probs, so every KL term is 0 (and the updates leave out
    their kl_ref metric)."""
    return float(cfg.kl_coef) > 0 or bool(getattr(cfg, "adaptive_kl", False))


def old_values_source(pdef: PolicyDef, cfg, old_logprobs: str) -> str:
    """The static rule for where `score_batch` takes the old values: "rollout" when
    cfg.old_values is "rollout", the critic is the policy's own head and the old log-probs come
    from the rollout too (otherwise the policy forward that re-scores them gives the values);
    "rescore" else."""
    if (getattr(cfg, "old_values", "rescore") == "rollout" and pdef.value_mode == "head"
            and old_logprobs == "rollout"):
        return "rollout"
    return "rescore"


def score_batch(pdef: PolicyDef, params, ref_params, batch: Trajectory, cfg, grammar=None,
                rollout_logprobs: Optional[jax.Array] = None,
                rollout_values: Optional[jax.Array] = None):
    """The rollout scoring pass: (logprobs, ref_logprobs, values), each [B, R] float32 and 0
    on masked tokens (values 0 when value_mode="none"). No gradients. `grammar`: the
    rollout's grammar (with batch.fsm_states, or replayed from the tokens).

    rollout_logprobs [B, R] float32: the generator's sampled-token log-probs of
    batch.response_tokens. When `old_logprobs_source` says "rollout", they are returned
    (masked) as the old log-probs and the policy's forward is skipped — entirely for
    value_mode "none" (GRPO) and "critic" (only the critic's trunk runs for the values);
    for "head" the policy trunk still runs for the values, without its LM head, unless
    `old_values_source` says "rollout": then rollout_values [B, R] float32 (`head_values` of
    the generator's step_hidden) are the values and no policy forward runs. Otherwise the
    policy forward re-scores them. The reference forward runs when the KL is charged
    (`uses_reference`); otherwise ref_logprobs are the old log-probs.

    Use it to fill a Trajectory: `batch.replace(old_logprobs=lp, ref_logprobs=ref, values=v)`.

    `cfg.micro_batch` > 0 scores the rows in chunks of that many (`lax.map`), so only one
    chunk's activations are live (the whole batch at once needs [B, heads, S, S] attention
    temporaries). Chunk i holds rows i, i + B/m, ...: strided, so rows split along the data
    axes stay split inside every chunk (and prompt groups, `cfg.prompt_group`, are not
    shared inside a chunk). Results are the same as unchunked.
    """
    source = old_logprobs_source(pdef, cfg, rollout_logprobs is not None)
    rows = batch.response_tokens.shape[0]
    rollout_logprobs = (_per_token("rollout_logprobs", rollout_logprobs, batch)
                        if source == "rollout" else None)
    if old_values_source(pdef, cfg, source) == "rollout":
        if rollout_values is None:
            raise ValueError("old_values='rollout' needs the rollout's values: pass "
                             "score_batch(..., rollout_values=...)")
        rollout_values = _per_token("rollout_values", rollout_values, batch)
    else:
        rollout_values = None
    micro = int(getattr(cfg, "micro_batch", 0) or 0)
    if 0 < micro < rows:
        if rows % micro:
            raise ValueError(f"micro_batch={micro} does not divide the {rows} scored rows")
        n = rows // micro
        chunks = jax.tree.map(
            lambda x: jnp.swapaxes(x.reshape((micro, n) + x.shape[1:]), 0, 1),
            (batch, rollout_logprobs, rollout_values))
        ccfg = cfg.replace(prompt_group=0) if _group(cfg, rows) else cfg
        out = jax.lax.map(
            lambda a: _score_rows(pdef, params, ref_params, a[0], ccfg, grammar, a[1], a[2]),
            chunks)
        return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1).reshape((rows,) + y.shape[2:]),
                            out)
    return _score_rows(pdef, params, ref_params, batch, cfg, grammar, rollout_logprobs,
                       rollout_values)


def _per_token(name: str, x, batch: Trajectory) -> jax.Array:
    """x as float32 [B, R], the shape of batch.response_tokens (ValueError naming x if not)."""
    x = jnp.asarray(x, jnp.float32)
    if x.shape != batch.response_tokens.shape:
        raise ValueError(f"{name} has shape {x.shape}, expected {batch.response_tokens.shape}")
    return x


def _score_rows(pdef: PolicyDef, params, ref_params, batch: Trajectory, cfg, grammar=None,
                rollout_logprobs=None, rollout_values=None):
    """score_batch over all rows of `batch` at once; rollout_logprobs [B, R] or None (then
    the policy forward re-scores); rollout_values [B, R] or None (then a forward gives the
    values)."""
    params = jax.lax.stop_gradient(params)
    m = batch.response_mask.astype(jnp.float32)
    if rollout_logprobs is None:
        ev = evaluate(pdef, params, ref_params, batch, cfg, with_values=True, grammar=grammar)
        lp, values = ev.logprobs, ev.values
    else:
        lp = jax.lax.stop_gradient(rollout_logprobs)
        if rollout_values is not None:
            values = jax.lax.stop_gradient(rollout_values)
        else:
            values = (values_only(pdef, params, ref_params, batch, cfg) if pdef.has_values
                      else None)
    ref = (reference_logprobs(pdef, ref_params, batch, cfg, grammar=grammar)
           if uses_reference(cfg) else lp)
    values = values if values is not None else jnp.zeros_like(lp)
    return lp * m, ref * m, values * m


def _chunk(cfg) -> int:
    return int(getattr(cfg, "logits_chunk", 0) or 0)


def sampling_config(cfg, r: int):
    """The generation SamplingConfig (r new tokens) matching the RL config's sampling
    distribution; a SamplingConfig passes through."""
    if isinstance(cfg, sampling_lib.SamplingConfig):
        return cfg
    return sampling_lib.SamplingConfig(max_new_tokens=r, temperature=cfg.temperature,
                                       top_k=cfg.top_k, top_p=cfg.top_p,
                                       stop_token_ids=tuple(cfg.stop_token_ids))
