"""The rollout's log-probs and values as the old log-probs and values
(`policy.score_batch(..., rollout_logprobs=, rollout_values=)`, `old_logprobs`, `old_values`),
the scoring pass without a KL term, and the shared-prompt forward (`prompt_group`), each against
an independent re-scoring / full forward."""
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


def _head_policy_with_values(seed=0):
    """A value_mode="head" policy whose head is not zero (the initial head gives V = 0)."""
    pdef, params, ref = _policy("head", seed=seed)
    head = params["value"]["head"]
    head = {"kernel": 0.1 * jax.random.normal(jax.random.PRNGKey(9), head["kernel"].shape),
            "bias": head["bias"] + 0.3}
    return pdef, {**params, "value": {**params["value"], "head": head}}, ref


def test_rollout_values_match_the_scoring_forward():
    """old_values="rollout": the generator's step_hidden through the value head gives the
    values a scoring forward gives, within 1e-5 on every valid token (the values are
    non-trivial: |V| > 0.1 somewhere); masked slots are 0, and the log-probs and reference are
    unchanged. Negative control: the hidden states shifted by one step (the state after the
    token instead of the one that sampled it) are rejected by the same comparison."""
    pdef, params, ref = _head_policy_with_values()
    cfg = ppo.PPOConfig(temperature=0.7, top_k=12, top_p=0.95, stop_token_ids=(END,))
    model = nnx.merge(pdef.graphdef, params["policy"])
    prompt, pmask = standard_prompts(group=GROUP)
    out = generate(model, prompt, pmask, jax.random.PRNGKey(5),
                   policy_lib.sampling_config(cfg, RESP), step_hidden=True)
    m = np.asarray(out.mask)
    assert 0 < m.sum() < m.size  # ragged responses
    traj = buffer.make_trajectory(prompt, pmask, out.tokens, out.mask,
                                  scores=jnp.zeros(prompt.shape[0]))
    rollout_v = jnp.where(out.mask, policy_lib.head_values(params, out.step_hidden), 0.0)
    on = cfg.replace(old_values="rollout")
    assert policy_lib.old_values_source(pdef, on, "rollout") == "rollout"
    assert policy_lib.old_values_source(pdef, on, "rescore") == "rescore"
    assert policy_lib.old_values_source(pdef, cfg, "rollout") == "rescore"
    got = policy_lib.score_batch(pdef, params, ref, traj, on, rollout_logprobs=out.logprobs,
                                 rollout_values=rollout_v)
    want = policy_lib.score_batch(pdef, params, ref, traj, cfg, rollout_logprobs=out.logprobs)
    v, w = np.asarray(got[2]), np.asarray(want[2])
    assert np.abs(w[m]).max() > 0.1
    np.testing.assert_allclose(v[m], w[m], atol=1e-5)
    assert np.all(v[~m] == 0)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    # chunked scoring (micro_batch) carries the values row by row
    chunked = policy_lib.score_batch(pdef, params, ref, traj, on.replace(micro_batch=GROUP),
                                     rollout_logprobs=out.logprobs, rollout_values=rollout_v)
    np.testing.assert_array_equal(np.asarray(chunked[2]), v)
    shifted = jnp.roll(out.step_hidden, -1, axis=1)
    bad = jnp.where(out.mask, policy_lib.head_values(params, shifted), 0.0)
    got_bad = policy_lib.score_batch(pdef, params, ref, traj, on, rollout_logprobs=out.logprobs,
                                     rollout_values=bad)[2]
    assert np.abs(np.asarray(got_bad)[m] - w[m]).max() > 1e-3
    with pytest.raises(ValueError, match="rollout_values"):
        policy_lib.score_batch(pdef, params, ref, traj, on, rollout_logprobs=out.logprobs)


def test_no_reference_forward_without_a_kl_term():
    """kl_coef = 0 (no adaptive controller): score_batch returns the old log-probs as the
    reference's (every KL term 0) and its compiled program runs one forward fewer (FLOPs).
    Negative control: with kl_coef > 0 the reference log-probs differ from the policy's (the
    policy is not the reference here) and the FLOPs are higher."""
    pdef, params, ref = _policy("none")
    params = jax.tree.map(lambda x: x * 1.05, params)  # the policy is no longer the reference
    with_kl = grpo.GRPOConfig(group_size=GROUP, temperature=1.0, kl_coef=0.04)
    no_kl = with_kl.replace(kl_coef=0.0)
    assert policy_lib.uses_reference(with_kl) and not policy_lib.uses_reference(no_kl)
    assert policy_lib.uses_reference(ppo.PPOConfig(kl_coef=0.0, adaptive_kl=True,
                                                   adaptive_kl_init=0.1))
    traj, rollout_lp, m = _rollout(pdef, params, with_kl)
    flops, out = [], []
    for cfg in (with_kl, no_kl):
        fn = jax.jit(lambda p, r, t, lp, cfg=cfg: policy_lib.score_batch(
            pdef, p, r, t, cfg, rollout_logprobs=lp))
        flops.append(fn.lower(params, ref, traj, rollout_lp).compile().cost_analysis()["flops"])
        out.append(fn(params, ref, traj, rollout_lp))
    (lp_k, ref_k, _), (lp_0, ref_0, _) = out
    np.testing.assert_array_equal(np.asarray(ref_0), np.asarray(lp_0))
    assert np.abs(np.asarray(ref_k) - np.asarray(lp_k))[m].max() > 1e-3
    assert flops[1] < 0.5 * flops[0], flops
    # the update reports kl_ref only where a reference forward measured it
    for cfg, (lp, ref_lp, _) in ((with_kl, out[0]), (no_kl, out[1])):
        batch = traj.replace(old_logprobs=lp, ref_logprobs=ref_lp)
        state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
        metrics = grpo.make_update(cfg, pdef).fn(state, batch)[1]
        assert ("kl_ref" in metrics) == (cfg.kl_coef > 0)
        if cfg.kl_coef > 0:
            assert float(metrics["kl_ref"]) > 0


def test_config_rejects_unknown_modes():
    with pytest.raises(ValueError, match="old_values"):
        ppo.PPOConfig(old_values="sometimes")
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
