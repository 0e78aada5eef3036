"""The rollout's log-probs as the old log-probs (`policy.score_batch(...,
rollout_logprobs=)`, `old_logprobs`), and the shared-prompt forward (`prompt_group`), each
against an independent re-scoring / full forward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_rl_common import PROMPT, RESP, VOCAB, standard_prompts, tiny_config

from jaxsocial.generation import Repeat, compile_grammar, free_text, generate, scoring
from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.models import llama
from jaxsocial.rl import buffer, grpo, optim, ppo
from jaxsocial.rl import policy as policy_lib

END = 2
GROUP = 4


def _policy(value_mode="none", dtype="float32", seed=0):
    model = llama.Llama(tiny_config().replace(dtype=dtype), rngs=nnx.Rngs(seed))
    return policy_lib.init_policy(model, value_mode=value_mode)


def _rollout(pdef, params, cfg, group=GROUP, grammar=None, seed=5):
    """generate() from prompts repeated `group` times -> (Trajectory with fsm_states,
    the generator's log-probs [B, R], response mask [B, R] numpy)."""
    model = nnx.merge(pdef.graphdef, params["policy"])
    prompt, pmask = standard_prompts(group=group)
    out = generate(model, prompt, pmask, jax.random.PRNGKey(seed),
                   policy_lib.sampling_config(cfg, RESP), grammar=grammar)
    states = (None if grammar is None else
              grammar_lib.step_states(grammar, out.tokens, out.mask))
    traj = buffer.make_trajectory(prompt, pmask, out.tokens, out.mask,
                                  scores=jnp.arange(prompt.shape[0], dtype=jnp.float32),
                                  fsm_states=states)
    return traj, out.logprobs, np.asarray(out.mask)


def _grammar():
    return compile_grammar([[[7], Repeat(tuple(range(10, 20)), 1, 3),
                             free_text(12, exclude=(0, 1, END))]], VOCAB, end_token_ids=(END,))


@pytest.mark.parametrize("value_mode", ["none", "head", "critic"])
def test_reused_rollout_logprobs_match_a_rescoring(value_mode):
    """auto (float32) returns the rollout's log-probs; they are within 1e-5 of a re-scoring
    (a separate score_batch with old_logprobs="rescore") on every valid token, ref and values
    are the re-scoring's, and masked slots are 0."""
    gram = _grammar()
    pdef, params, ref = _policy(value_mode)
    cfg = ppo.PPOConfig(temperature=0.7, top_k=12, top_p=0.95, stop_token_ids=(END,))
    traj, rollout_lp, m = _rollout(pdef, params, cfg, grammar=gram)
    assert 0 < m.sum() < m.size  # ragged responses
    assert policy_lib.old_logprobs_source(pdef, cfg, True) == "rollout"
    lp, ref_lp, values = policy_lib.score_batch(pdef, params, ref, traj, cfg, gram,
                                                rollout_logprobs=rollout_lp)
    want = policy_lib.score_batch(pdef, params, ref, traj, cfg.replace(old_logprobs="rescore"),
                                  gram)
    np.testing.assert_array_equal(np.asarray(lp)[m], np.asarray(rollout_lp)[m])  # reused
    assert np.all(np.asarray(lp)[~m] == 0)
    gap = np.max(np.abs(np.asarray(lp) - np.asarray(want[0]))[m])
    assert gap < 1e-5, gap
    np.testing.assert_allclose(np.asarray(ref_lp), np.asarray(want[1]), atol=1e-6)
    np.testing.assert_allclose(np.asarray(values), np.asarray(want[2]), atol=1e-6)


def test_rollout_mode_takes_what_it_is_given_and_the_gap_shows_it():
    """Negative control: perturbed rollout log-probs are passed through by "rollout" (so a
    re-scoring exposes a gap > 1e-5) and ignored by "rescore"."""
    pdef, params, ref = _policy("none")
    cfg = grpo.GRPOConfig(group_size=GROUP, temperature=1.0)
    traj, rollout_lp, m = _rollout(pdef, params, cfg)
    bad = rollout_lp + 1e-3 * jnp.arange(rollout_lp.size).reshape(rollout_lp.shape) % 3
    lp_bad = policy_lib.score_batch(pdef, params, ref, traj, cfg.replace(old_logprobs="rollout"),
                                    rollout_logprobs=bad)[0]
    lp_re = policy_lib.score_batch(pdef, params, ref, traj, cfg.replace(old_logprobs="rescore"),
                                   rollout_logprobs=bad)[0]
    assert np.max(np.abs(np.asarray(lp_bad) - np.asarray(lp_re))[m]) > 1e-4
    np.testing.assert_allclose(np.asarray(lp_re)[m], np.asarray(rollout_lp)[m], atol=1e-5)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        policy_lib.score_batch(pdef, params, ref, traj, cfg.replace(old_logprobs="rollout"))


def test_auto_falls_back_to_a_rescoring_when_not_exact():
    """bfloat16 compute: auto re-scores (the returned log-probs are the policy's, not the
    perturbed ones passed in); without rollout log-probs it re-scores too."""
    pdef, params, ref = _policy("none", dtype="bfloat16")
    cfg = grpo.GRPOConfig(group_size=GROUP, temperature=1.0)
    assert policy_lib.old_logprobs_source(pdef, cfg, True) == "rescore"
    assert policy_lib.old_logprobs_source(_policy("none")[0], cfg, False) == "rescore"
    traj, rollout_lp, m = _rollout(pdef, params, cfg)
    bad = rollout_lp - 0.5
    lp = policy_lib.score_batch(pdef, params, ref, traj, cfg, rollout_logprobs=bad)[0]
    want = policy_lib.evaluate(pdef, params, ref, traj, cfg, with_values=False).logprobs
    np.testing.assert_allclose(np.asarray(lp)[m], np.asarray(want)[m], atol=1e-6)
    assert np.min(np.abs(np.asarray(lp) - np.asarray(bad))[m]) > 0.1


def test_config_rejects_unknown_modes():
    with pytest.raises(ValueError, match="old_logprobs"):
        ppo.PPOConfig(old_logprobs="sometimes")
    with pytest.raises(ValueError, match="prompt_group"):
        grpo.GRPOConfig(prompt_group=1)


# ----------------------------------------------------------------------------------------------
# Shared prompts


def _ragged_batch(group=GROUP, seed=0):
    prompt, pmask = standard_prompts(group=group)
    b = prompt.shape[0]
    toks = jax.random.randint(jax.random.PRNGKey(seed), (b, RESP), 3, VOCAB)
    lengths = jax.random.randint(jax.random.PRNGKey(seed + 1), (b,), 1, RESP + 1)
    rmask = jnp.arange(RESP)[None] < lengths[:, None]
    return buffer.make_trajectory(prompt, pmask, toks, rmask, scores=jnp.zeros(b))


def test_grouped_hidden_equals_the_full_forward():
    """response_hidden_grouped (prompt once per group + cached responses) == response_hidden
    on the concatenated rows, values and weight gradients."""
    pdef, params, _ = _policy("none")
    batch = _ragged_batch()
    w = params["policy"]
    p, r = PROMPT, RESP
    m = batch.response_mask.astype(jnp.float32)[..., None]
    probe = jax.random.normal(jax.random.PRNGKey(3), (batch.batch_size, r, 32))

    def full(w):
        model = nnx.merge(pdef.graphdef, w)
        ids = jnp.concatenate([batch.prompt_tokens, batch.response_tokens], 1)
        mask = jnp.concatenate([batch.prompt_mask, batch.response_mask], 1)
        return scoring.response_hidden(model, ids, mask, p, r)[0]

    def grouped(w):
        model = nnx.merge(pdef.graphdef, w)
        return scoring.response_hidden_grouped(model, batch.prompt_tokens, batch.prompt_mask,
                                               batch.response_tokens, batch.response_mask,
                                               GROUP)[0]

    np.testing.assert_allclose(np.asarray(grouped(w) * m), np.asarray(full(w) * m), atol=2e-5)
    g_full = jax.grad(lambda w: jnp.sum(full(w) * m * probe))(w)
    g_grp = jax.grad(lambda w: jnp.sum(grouped(w) * m * probe))(w)
    for a, b in zip(jax.tree.leaves(g_grp), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


def test_prompt_group_is_checked_at_run_time():
    """prompt_group on a batch whose groups share prompts and on one whose do not (the
    lax.cond takes the full forward): both match the unshared log-probs; the shared branch
    really runs (a batch with one prompt per row, mislabelled as groups, would be wrong
    if the check did not catch it)."""
    pdef, params, ref = _policy("none")
    cfg0 = grpo.GRPOConfig(group_size=GROUP, temperature=0.7)
    cfg = cfg0.replace(prompt_group=GROUP)
    for batch in (_ragged_batch(GROUP), _ragged_batch(1)):
        want = policy_lib.evaluate(pdef, params, ref, batch, cfg0, with_values=False).logprobs
        got = policy_lib.evaluate(pdef, params, ref, batch, cfg, with_values=False).logprobs
        m = np.asarray(batch.response_mask)
        np.testing.assert_allclose(np.asarray(got)[m], np.asarray(want)[m], atol=2e-5)
    shared = _ragged_batch(GROUP)
    assert bool(scoring.prompts_shared(shared.prompt_tokens, shared.prompt_mask, GROUP))
    distinct = _ragged_batch(1)
    assert not bool(scoring.prompts_shared(distinct.prompt_tokens, distinct.prompt_mask, GROUP))
    # Negative control: forcing the grouped path on distinct prompts changes the answer.
    model = nnx.merge(pdef.graphdef, params["policy"])
    forced = scoring.response_hidden_grouped(model, distinct.prompt_tokens, distinct.prompt_mask,
                                             distinct.response_tokens, distinct.response_mask,
                                             GROUP)[0]
    ids = jnp.concatenate([distinct.prompt_tokens, distinct.response_tokens], 1)
    mask = jnp.concatenate([distinct.prompt_mask, distinct.response_mask], 1)
    real = scoring.response_hidden(model, ids, mask, PROMPT, RESP)[0]
    assert float(jnp.max(jnp.abs(forced - real))) > 1e-2


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_update_with_prompt_group_equals_without(algo):
    """One update (1 epoch, 1 minibatch) with prompt_group: same params and metrics as
    without it (groups shuffled whole; the grouped forward's gradient)."""
    if algo == "grpo":
        pdef, params, ref = _policy("none")
        base = grpo.GRPOConfig(group_size=GROUP, learning_rate=1e-3, kl_coef=0.04,
                               temperature=1.0)
        mod = grpo
    else:
        pdef, params, ref = _policy("head")
        base = ppo.PPOConfig(learning_rate=1e-3, ppo_epochs=1, kl_coef=0.04, temperature=1.0)
        mod = ppo
    traj, rollout_lp, _ = _rollout(pdef, params, base)
    lp, ref_lp, values = policy_lib.score_batch(pdef, params, ref, traj, base,
                                                rollout_logprobs=rollout_lp)
    traj = traj.replace(old_logprobs=lp, ref_logprobs=ref_lp, values=values,
                        scores=jnp.arange(traj.batch_size, dtype=jnp.float32) % 3)
    out = {}
    for name, cfg in (("plain", base), ("grouped", base.replace(prompt_group=GROUP))):
        state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
        out[name] = jax.jit(mod.make_update(cfg, pdef).fn)(state, traj)
    (s0, m0), (s1, m1) = out["plain"], out["grouped"]
    for k in ("loss", "policy_loss", "grad_norm", "ratio"):
        assert float(m1[k]) == pytest.approx(float(m0[k]), rel=1e-4, abs=1e-6), k
    # Adam steps are ~lr per element whatever the gradient's size, so an element with a
    # near-zero gradient may move differently by rounding: allow 1% of one step.
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s0.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-2 * base.learning_rate)
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                zip(jax.tree.leaves(s1.params), jax.tree.leaves(params)))
    assert moved > 1e-5  # the update did something
