"""Shared helpers for the RL tests (a tiny policy, a cache-based sampling loop, rewards).

The sampling loop here is the test's own rollout (prefill + lax.scan decode through the KV
cache, drawing with `sampling.sample`); the generate()-based check lives in test_rl_policy.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.generation import sampling as sampling_lib
from jaxsocial.models import llama
from jaxsocial.rl import buffer, grpo, ppo
from jaxsocial.rl import policy as policy_lib


def tiny_config(**kw):
    base = dict(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1)
    base.update(kw)
    return llama.preset("tiny", **base)


VOCAB = 32
PROMPT = 4
RESP = 16
BATCH = 16
TARGET = 5  # the rewarded token of the synthetic task

# Shared configs: the compiled updates are cached per (config, policy), so test files reuse
# them within one pytest run.
PPO_LEARN = ppo.PPOConfig(learning_rate=1e-3, temperature=1.0, kl_coef=0.01)
PPO_SMALL = ppo.PPOConfig(learning_rate=1e-3, temperature=1.0, ppo_epochs=2, num_minibatches=2,
                          adaptive_kl=True, reward_norm="running")
# First-ratio checks: tempered, truncated (top-k, top-p) distribution, one optimizer step.
PPO_FIRST = ppo.PPOConfig(temperature=0.7, top_k=12, top_p=0.95, stop_token_ids=(2,),
                          ppo_epochs=1, learning_rate=1e-3)
GRPO_LEARN = grpo.GRPOConfig(group_size=4, learning_rate=3e-3, ppo_epochs=4)
@functools.lru_cache(maxsize=None)
def tiny_policy(value_mode="head", seed=0):
    """(pdef, params, ref_params) of a 1-layer, 32-token Llama; cached per (mode, seed)."""
    from flax import nnx
    model = llama.Llama(tiny_config(), rngs=nnx.Rngs(seed))
    return policy_lib.init_policy(model, value_mode=value_mode)


@functools.lru_cache(maxsize=None)
def compiled_update(cfg, value_mode="head", seed=0):
    """The jitted PPO/GRPO update for `cfg` on tiny_policy(value_mode, seed); cached."""
    pdef = tiny_policy(value_mode, seed)[0]
    mod = grpo if isinstance(cfg, grpo.GRPOConfig) else ppo
    return mod.make_update(cfg, pdef)


@functools.lru_cache(maxsize=None)
def standard_prompts(batch=BATCH, group=1, seed=1):
    """Left-padded prompts [batch, PROMPT]; with group > 1 each prompt repeats `group` times."""
    prompt, mask = make_prompts(jax.random.PRNGKey(seed), batch // group, PROMPT, VOCAB)
    return jnp.repeat(prompt, group, axis=0), jnp.repeat(mask, group, axis=0)


def make_prompts(key, batch, prompt_len, vocab, min_len=2):
    """Left-padded random prompts [B, P] int32 with ragged lengths, mask bool."""
    k1, k2 = jax.random.split(key)
    lengths = jax.random.randint(k1, (batch,), min_len, prompt_len + 1)
    toks = jax.random.randint(k2, (batch, prompt_len), 3, vocab, dtype=jnp.int32)
    mask = jnp.arange(prompt_len)[None, :] >= (prompt_len - lengths)[:, None]
    return jnp.where(mask, toks, 0).astype(jnp.int32), mask


@functools.partial(jax.jit, static_argnames=("graphdef", "scfg", "n"))
def sample_responses(graphdef, weights, prompt, prompt_mask, key, scfg, n, allowed=None):
    """Sample n tokens per row through the KV cache (optional grammar mask allowed
    [B, n, V] bool). -> (tokens [B, n], logprobs [B, n])."""
    from flax import nnx
    model = nnx.merge(graphdef, weights)
    b, p = prompt.shape
    cache = llama.init_cache(model.config, b, p + n)
    out = model.forward(prompt, prompt_mask, cache=cache)

    if allowed is None:
        allowed = jnp.ones((b, n, model.config.vocab_size), bool)

    def step(carry, xs):
        logits, cache = carry
        k, allow = xs
        tok, lp = sampling_lib.sample(k, logits, scfg, allow)
        o = model.forward(tok[:, None], jnp.ones((b, 1), bool), cache=cache)
        return (o.logits[:, -1], o.cache), (tok, lp)

    xs = (jax.random.split(key, n), jnp.swapaxes(allowed, 0, 1))
    _, (toks, lps) = jax.lax.scan(step, (out.logits[:, -1], out.cache), xs)
    return toks.T, lps.T


def rollout(pdef, params, ref_params, cfg, key, prompt, prompt_mask, n, score_fn,
            response_mask=None, allowed=None):
    """Sample, score with `score_fn(tokens) -> [B]`, fill log-probs/values by score_batch.

    With per-step masks `allowed [B, n, V]` the trajectory stores FSM states of an equivalent
    grammar (`grammar_from_masks`) and the result is (traj, gen_lp, grammar)."""
    scfg = policy_lib.sampling_config(cfg, n)
    weights = policy_lib.policy_weights(pdef, params, ref_params)
    toks, gen_lp = sample_responses(pdef.graphdef, weights, prompt, prompt_mask, key, scfg, n,
                                   allowed)
    if response_mask is None:
        response_mask = jnp.ones(toks.shape, bool)
    gram = states = None
    if allowed is not None:
        gram, states = grammar_lib.grammar_from_masks(allowed)
    traj = buffer.make_trajectory(prompt, prompt_mask, toks, response_mask,
                                  scores=score_fn(toks), fsm_states=states)
    lp, ref, values = score(pdef, cfg, params, ref_params, traj, gram)
    traj = traj.replace(old_logprobs=lp, ref_logprobs=ref, values=values)
    return (traj, gen_lp) if allowed is None else (traj, gen_lp, gram)


@functools.partial(jax.jit, static_argnums=(0, 1))
def score(pdef, cfg, params, ref_params, traj, grammar=None):
    return policy_lib.score_batch(pdef, params, ref_params, traj, cfg, grammar)


def count_token(token):
    return lambda toks: jnp.sum(toks == token, axis=-1).astype(jnp.float32)


def np_f64(x):
    return np.asarray(x, np.float64)
