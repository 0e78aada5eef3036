"""The PPO update on a tiny Llama: first ratio 1, NaN guard, no retrace, grad accumulation,
critic mode, and learning a synthetic reward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_rl_common import (
    PPO_FIRST,
    PPO_LEARN,
    PPO_SMALL,
    RESP,
    TARGET,
    VOCAB,
    compiled_update,
    count_token,
    rollout,
    standard_prompts,
    tiny_config,
    tiny_policy,
)

from jaxsocial.models import llama
from jaxsocial.rl import optim, ppo
from jaxsocial.rl import policy as policy_lib


@pytest.fixture(scope="module")
def setup():
    return tiny_policy("head") + standard_prompts()


@pytest.fixture(scope="module")
def small_update(setup):
    return PPO_SMALL, compiled_update(PPO_SMALL)


def _state(cfg, setup, seed=0):
    pdef, params, ref = setup[:3]
    return optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(seed))


def _ragged_mask(key, b, n):
    lengths = jax.random.randint(key, (b,), 1, n + 1)
    return jnp.arange(n)[None, :] < lengths[:, None]


def test_first_ratio_is_one_with_temperature_topk_topp_and_grammar(setup):
    pdef, params, ref, prompt, pmask = setup
    cfg = PPO_FIRST
    b = prompt.shape[0]
    allowed = jax.random.bernoulli(jax.random.PRNGKey(2), 0.6, (b, RESP, VOCAB))
    allowed = allowed.at[..., TARGET].set(True)
    rmask = _ragged_mask(jax.random.PRNGKey(3), b, RESP)
    traj, gen_lp, gram = rollout(pdef, params, ref, cfg, jax.random.PRNGKey(4), prompt, pmask,
                                 RESP, count_token(TARGET), response_mask=rmask, allowed=allowed)
    assert traj.fsm_states.shape == (b, RESP) and traj.fsm_states.dtype == jnp.int32
    m = np.asarray(rmask)
    # the grammar mask was honoured and is part of the recomputed distribution
    assert np.all(np.take_along_axis(np.asarray(allowed),
                                     np.asarray(traj.response_tokens)[..., None], -1)[..., 0])
    np.testing.assert_allclose(np.asarray(traj.old_logprobs)[m], np.asarray(gen_lp)[m], atol=1e-5)
    # the reference is the initial policy: KL to reference is 0 before any update
    np.testing.assert_allclose(np.asarray(traj.ref_logprobs), np.asarray(traj.old_logprobs),
                               atol=1e-6)
    # without the grammar mask the log-probs differ: the mask really is applied
    ev = policy_lib.evaluate(pdef, params, ref, traj.replace(fsm_states=None), cfg)
    assert np.max(np.abs(np.asarray(ev.logprobs)[m] - np.asarray(gen_lp)[m])) > 1e-3

    # The update's first (and only) minibatch step sees the generator's log-probs: ratio 1.
    state = _state(cfg, setup)
    traj = traj.replace(old_logprobs=gen_lp * rmask)
    _, metrics = compiled_update(cfg)(state, traj, gram)
    assert float(metrics["ratio"]) == pytest.approx(1.0, abs=1e-5)
    assert abs(float(metrics["approx_kl"])) < 1e-8
    assert float(metrics["clip_frac"]) == 0.0


def test_nan_guard_skips_and_counts(setup, small_update):
    cfg, update = small_update
    pdef, params, ref, prompt, pmask = setup
    state = _state(cfg, setup)
    traj, _ = rollout(pdef, params, ref, cfg, jax.random.PRNGKey(5), prompt, pmask, RESP,
                      count_token(TARGET))
    steps_per_update = cfg.ppo_epochs * cfg.num_minibatches
    for poisoned in (traj.replace(scores=traj.scores.at[3].set(jnp.nan)),
                     traj.replace(old_logprobs=traj.old_logprobs.at[0, 2].set(-jnp.inf))):
        new, metrics = update(state, poisoned)
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                     (new.params, new.opt_state, new.step),
                     (state.params, state.opt_state, state.step))
        assert int(new.nonfinite_skips) == steps_per_update
        assert float(metrics["skipped_steps"]) == steps_per_update
        assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(new.params))
        # the running reward stats and KL coefficient are not corrupted either
        assert np.isfinite(float(new.kl.coef)) and np.isfinite(float(new.reward_stats.var))
    # a clean batch afterwards trains normally and keeps the counter
    new2, metrics = update(new, traj)
    assert int(new2.nonfinite_skips) == steps_per_update
    assert int(new2.step) == steps_per_update
    changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                           new2.params["policy"], state.params["policy"])
    assert any(jax.tree.leaves(changed))


def test_update_compiles_once(setup, small_update):
    cfg, update = small_update
    pdef, params, ref, prompt, pmask = setup
    state = _state(cfg, setup, seed=1)
    counts = []
    for i in range(3):
        traj, _ = rollout(pdef, state.params, ref, cfg, jax.random.PRNGKey(20 + i), prompt, pmask,
                          RESP, count_token(TARGET))
        state, metrics = update(state, traj)
        counts.append(update.trace_count)
    jax.block_until_ready(state)
    # one trace in total (an earlier test may have made it), none for the later batches
    assert counts == [1, 1, 1], counts
    assert int(state.step) == 3 * cfg.ppo_epochs * cfg.num_minibatches
    for k in ("policy_loss", "value_loss", "approx_kl", "kl_ref", "clip_frac", "entropy",
              "explained_variance", "grad_norm", "learning_rate"):
        assert np.isfinite(float(metrics[k])), k
    assert float(metrics["learning_rate"]) == pytest.approx(1e-3)


def test_grad_accumulation_equals_full_minibatch(setup):
    pdef, params, ref, prompt, pmask = setup
    base = ppo.PPOConfig(learning_rate=1e-3, temperature=1.0, ppo_epochs=1)
    traj, _ = rollout(pdef, params, ref, base, jax.random.PRNGKey(6), prompt, pmask, RESP,
                      count_token(TARGET), response_mask=_ragged_mask(jax.random.PRNGKey(7),
                                                                      16, RESP))
    # ragged lengths: per-token means must use the minibatch's token count, not per micro-batch
    _, m1 = ppo.make_update(base, pdef)(_state(base, setup), traj)
    acc = base.replace(grad_accum_steps=4)
    _, m4 = ppo.make_update(acc, pdef)(_state(acc, setup), traj)
    for k in ("loss", "policy_loss", "value_loss", "grad_norm", "entropy"):
        assert float(m4[k]) == pytest.approx(float(m1[k]), rel=1e-4, abs=1e-6), k


def test_bad_minibatch_split_is_a_clear_error(setup):
    pdef, params, ref, prompt, pmask = setup
    traj, _ = rollout(pdef, params, ref, PPO_SMALL, jax.random.PRNGKey(6), prompt, pmask, RESP,
                      count_token(TARGET))
    cfg = PPO_SMALL.replace(num_minibatches=3)  # 16 rows do not split into 3 minibatches
    with pytest.raises(ValueError, match="num_minibatches"):
        ppo.make_update(cfg, pdef)(_state(cfg, setup), traj)


def test_separate_critic_trains_its_own_trunk(setup):
    prompt, pmask = setup[3:]
    model = llama.Llama(tiny_config(), rngs=nnx.Rngs(3))
    critic = llama.Llama(tiny_config(hidden_size=16, intermediate_size=32), rngs=nnx.Rngs(4))
    pdef, params, ref = policy_lib.init_policy(model, value_mode="critic", critic=critic)
    # 2 epochs: the value head starts at zero, so the trunk gets gradient from step 2 on
    cfg = ppo.PPOConfig(learning_rate=1e-3, temperature=1.0, ppo_epochs=2)
    state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
    traj, _ = rollout(pdef, params, ref, cfg, jax.random.PRNGKey(8), prompt, pmask, RESP,
                      lambda t: jnp.arange(t.shape[0], dtype=jnp.float32))
    new, metrics = ppo.make_update(cfg, pdef)(state, traj)
    old_trunk, new_trunk = state.params["value"]["trunk"], new.params["value"]["trunk"]
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                         new_trunk["layers"], old_trunk["layers"])
    assert all(jax.tree.leaves(moved))
    # the critic never uses its LM head: no gradient, no change
    np.testing.assert_array_equal(np.asarray(new_trunk["lm_head"]),
                                  np.asarray(old_trunk["lm_head"]))
    assert new_trunk["embed_tokens"].shape[1] == 16  # the critic's own (smaller) trunk
    ref_same = jax.tree.map(lambda a, b: bool(np.all(np.asarray(a) == np.asarray(b))),
                            new.ref_params, state.ref_params)
    assert all(jax.tree.leaves(ref_same))
    assert float(metrics["value_loss"]) > 0


def test_ppo_learns_synthetic_reward(setup):
    """+1 per occurrence of TARGET in a 16-token response: the mean reward rises clearly."""
    pdef, params, ref, prompt, pmask = setup
    cfg = PPO_LEARN
    update = compiled_update(cfg)
    before = update.trace_count
    state = _state(cfg, setup)
    scores = []
    for i in range(10):
        traj, _ = rollout(pdef, state.params, ref, cfg, jax.random.PRNGKey(100 + i), prompt,
                          pmask, RESP, count_token(TARGET))
        state, metrics = update(state, traj)
        scores.append(float(metrics["score_mean"]))
    first, last = np.mean(scores[:2]), np.mean(scores[-3:])
    assert last >= first + 0.75 and last >= 2.0 * first, scores
    assert int(state.nonfinite_skips) == 0
    assert update.trace_count - before <= 1


def test_the_learning_rate_is_an_input_of_the_update_not_a_constant(setup):
    """The peak learning rate is the train state's (`TrainState.learning_rate`): a study's frozen
    control (learning_rate=0) runs the trained arm's program, traced once, and keeps its weights
    bit for bit while the trained state's move. Control: another clip_eps is another program."""
    import dataclasses
    pdef, params, ref, prompt, pmask = setup
    cfg = PPO_FIRST
    frozen = dataclasses.replace(cfg, learning_rate=0.0)
    traj, _ = rollout(pdef, params, ref, cfg, jax.random.PRNGKey(5), prompt, pmask, RESP,
                      count_token(TARGET))
    hlo = lambda c: ppo.make_update(c, pdef).lower(_state(c, setup), traj).as_text()  # noqa
    assert hlo(frozen) == hlo(cfg)
    assert hlo(dataclasses.replace(cfg, clip_eps=0.1)) != hlo(cfg)  # control: a constant
    update = ppo.make_update(cfg, pdef)
    trained, metrics = update(_state(cfg, setup), traj)
    kept, kept_metrics = update(_state(frozen, setup), traj)
    assert update.trace_count == 1
    assert float(metrics["learning_rate"]) == pytest.approx(1e-3)
    assert float(kept_metrics["learning_rate"]) == 0.0
    same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), kept.params, params)
    assert all(jax.tree.leaves(same))
    moved = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), trained.params, params)
    assert not all(jax.tree.leaves(moved))
