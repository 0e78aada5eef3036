"""Token-level PPO for an LLM policy: what PPO adds to the shared engine (`optim.py`) and loss
terms (`losses.py`), which GRPO (`grpo.py`) runs on too.

Pieces (all [B, T] float32 over the response tokens unless stated; mask 1 on valid tokens):
  PPOConfig          (rl.config) OptimConfig plus the critic, GAE and KL-controller knobs
  token_rewards      r_t = -beta * kl_t (+ episode score at the last valid token)
  compute_gae        GAE as a reverse lax.scan; returns = advantages + values
  adaptive_kl_update Ziegler et al. (2019) proportional controller
  make_update        the jitted update: clipped surrogate + clipped value loss (- entropy)
                     through `optim.run_epochs`
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxsocial.rl import losses, optim
from jaxsocial.rl import policy as policy_lib
from jaxsocial.rl import state as state_lib
from jaxsocial.rl.buffer import Trajectory, check_trajectory
from jaxsocial.rl.config import KL_PER, REWARD_NORMS, PPOConfig  # noqa: F401 (ppo.PPOConfig)

Array = jax.Array


# ----------------------------------------------------------------------------------------------
# Rewards, advantages, KL controller


def token_rewards(scores: Array, kl: Array, mask: Array, kl_coef, kl_per: str = "token"
                  ) -> Array:
    """[B, T] token rewards: scores[b] at the last valid token, plus the KL penalty:
    kl_per="token": -kl_coef * kl_t on every valid token; "sequence": one term
    -kl_coef * mean_t kl_t (over the valid tokens) at the last valid token."""
    chex.assert_equal_shape([kl, mask])
    m = mask.astype(jnp.float32)
    kl = kl.astype(jnp.float32) * m
    last = losses.last_valid_index(mask)
    at_last = jax.nn.one_hot(last, mask.shape[-1], dtype=jnp.float32) * m
    coef = jnp.asarray(kl_coef, jnp.float32)
    if kl_per == "sequence":
        kl_mean = jnp.sum(kl, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)
        return (scores.astype(jnp.float32) - coef * kl_mean)[:, None] * at_last
    if kl_per != "token":
        raise ValueError(f"kl_per={kl_per!r}; choose one of {KL_PER}")
    return -coef * kl + scores.astype(jnp.float32)[:, None] * at_last


def compute_gae(rewards: Array, values: Array, mask: Array, gamma: float,
                lam: float) -> tuple[Array, Array]:
    """Generalised advantage estimation over the response tokens, as a reverse lax.scan.

    rewards, values, mask: [B, T]; returns (advantages, returns), both [B, T] float32.
      delta_t = r_t + gamma * V_next - V_t
      A_t     = delta_t + gamma * lam * A_next
    where (V_next, A_next) belong to the next *valid* token (0 after the last one): a masked
    position carries them through unchanged and gets A = 0, return = 0.
    returns_t = A_t + V_t on valid tokens.
    """
    chex.assert_equal_shape([rewards, values, mask])
    r = rewards.astype(jnp.float32)
    v = values.astype(jnp.float32)
    m = mask.astype(jnp.float32)

    def step(carry, xs):
        next_value, next_adv = carry
        r_t, v_t, m_t = xs
        delta = r_t + gamma * next_value - v_t
        adv = delta + gamma * lam * next_adv
        carry = (m_t * v_t + (1.0 - m_t) * next_value, m_t * adv + (1.0 - m_t) * next_adv)
        return carry, adv * m_t

    zeros = jnp.zeros(r.shape[0], jnp.float32)
    _, adv = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, m.T), reverse=True)
    adv = adv.T
    return adv, (adv + v) * m


def adaptive_kl_update(coef: Array, current_kl: Array, n_steps, target: float,
                       horizon: float) -> Array:
    """Ziegler et al. (2019): e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon.

    current_kl is the batch mean of the per-sequence summed KL; n_steps the number of
    sequences in the batch. A non-finite KL leaves beta unchanged.
    """
    err = jnp.clip(current_kl / target - 1.0, -0.2, 0.2)
    new = coef * (1.0 + err * n_steps / horizon)
    return jnp.where(jnp.isfinite(new), new, coef).astype(jnp.float32)


def update_kl_state(cfg, kl: state_lib.KLState, current_kl: Array, n_steps) -> state_lib.KLState:
    if not cfg.adaptive_kl:
        return kl
    return state_lib.KLState(coef=adaptive_kl_update(kl.coef, current_kl, n_steps,
                                                     cfg.kl_target, cfg.kl_horizon))


# ----------------------------------------------------------------------------------------------
# PPO update


def rollout_advantages(cfg: PPOConfig, batch: Trajectory, kl_coef: Array,
                       reward_stats: state_lib.RunningStats):
    """Token rewards, GAE advantages and returns from a rollout batch (no gradients).

    Returns (advantages [B, R], returns [B, R], rewards [B, R], kl [B, R], new reward_stats).
    """
    mask = batch.response_mask
    scores = losses.stop_penalized(batch.scores, batch.response_tokens, mask,
                                   cfg.stop_token_ids, cfg.missing_stop_penalty)
    if cfg.reward_norm == "running":
        reward_stats = state_lib.update_running_stats(reward_stats, scores)
        scores = scores * jax.lax.rsqrt(reward_stats.var + 1e-8)
    if cfg.reward_clip is not None:
        scores = jnp.clip(scores, -cfg.reward_clip, cfg.reward_clip)
    kl = losses.kl_penalty(batch.old_logprobs, batch.ref_logprobs, cfg.kl_estimator) * mask
    rewards = token_rewards(scores, kl, mask, kl_coef, cfg.kl_per)
    if cfg.whiten_rewards:
        rewards = losses.masked_whiten(rewards, mask, shift_mean=False)
    values = batch.values * mask
    adv, returns = compute_gae(rewards, values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        adv = losses.masked_whiten(adv, mask)
    return adv, returns, rewards, kl, reward_stats


def make_update(cfg: PPOConfig, pdef, donate: bool = False, grammar=None) -> optim.CompiledUpdate:
    """Build the jitted PPO update for the policy described by `pdef` (policy.PolicyDef).

    update(state: TrainState, batch: Trajectory, grammar=None) -> (state, metrics); grammar is
    the rollout's `Grammar` when batch.fsm_states is set (default: `grammar`, bound here as a
    default *argument*). metrics is a dict
    of float32 scalars: policy_loss, value_loss, loss, entropy, approx_kl, clip_frac,
    vf_clip_frac, value_error, explained_variance, kl_ref (mean per-sequence k1 to the
    reference; only when a KL term is charged, `policy.uses_reference`), kl_coef, score_mean,
    reward_mean (token rewards summed per sequence),
    grad_norm, learning_rate, skipped_steps, nonfinite_skips.
    """
    if pdef.value_mode == "none":
        raise ValueError("PPO needs a critic: build the policy with value_mode='head' or "
                         "'critic' (GRPO is the critic-free variant)")
    tx, schedule = optim.make_optimizer(cfg)

    def loss_fn(params, ref_params, rows, denom, grammar):
        out = policy_lib.evaluate(pdef, params, ref_params, rows["batch"], cfg,
                                  with_values=True, with_entropy=True,
                                  entropy_grad=cfg.ent_coef != 0, grammar=grammar)
        mask = rows["mask"]
        pg, pg_stats = losses.policy_loss(out.logprobs, rows["batch"].old_logprobs, rows["adv"],
                                          mask, cfg.clip_eps, cfg.clip_eps_high, denom["tokens"])
        vl, v_stats = losses.value_loss(out.values, rows["batch"].values, rows["returns"], mask,
                                        cfg.value_clip, denom["tokens"])
        ent = losses.masked_sum(out.entropy, mask) / denom["tokens"]
        loss = pg + cfg.vf_coef * vl - cfg.ent_coef * ent
        return loss, dict(pg_stats, **v_stats, policy_loss=pg, value_loss=vl, entropy=ent)

    def update(train_state: state_lib.TrainState, batch: Trajectory, grammar=None):
        check_trajectory(batch)
        mask = batch.response_mask
        adv, returns, rewards, kl, reward_stats = rollout_advantages(
            cfg, batch, train_state.kl.coef, train_state.reward_stats)
        next_key, key = jax.random.split(train_state.key)
        rows = {"batch": batch, "adv": adv, "returns": returns, "mask": mask}
        new_state, metrics = optim.run_epochs(
            lambda *a: loss_fn(*a, grammar), tx, schedule, train_state, rows,
            epochs=cfg.ppo_epochs, num_minibatches=cfg.num_minibatches,
            grad_accum_steps=cfg.grad_accum_steps, micro_batch=cfg.micro_batch, key=key,
            group=cfg.prompt_group)
        kl_seq = losses.sequence_kl(batch.old_logprobs, batch.ref_logprobs, mask)
        kl_state = update_kl_state(cfg, train_state.kl, kl_seq, batch.batch_size)
        if policy_lib.uses_reference(cfg):  # else no reference forward ran: nothing to report
            metrics["kl_ref"] = kl_seq
        metrics.update(
            kl_coef=train_state.kl.coef,
            score_mean=jnp.mean(batch.scores),
            reward_mean=jnp.mean(jnp.sum(rewards, axis=-1)),
            explained_variance=losses.explained_variance(batch.values, returns, mask),
            nonfinite_skips=new_state.nonfinite_skips.astype(jnp.float32),
        )
        new_state = new_state.replace(key=next_key, kl=kl_state, reward_stats=reward_stats)
        return new_state, metrics

    return optim.CompiledUpdate(update, donate=donate, grammar=grammar)
