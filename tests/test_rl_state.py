"""TrainState: checkpoint (train/checkpointing) round trip; Trajectory dtypes; LoRA adapters."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_rl_common import (
    GRPO_LEARN,
    PPO_SMALL,
    RESP,
    TARGET,
    compiled_update,
    count_token,
    rollout,
    score,
    standard_prompts,
    tiny_config,
    tiny_policy,
)

from jaxsocial.models import llama
from jaxsocial.rl import buffer, optim, ppo
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl import policy as policy_lib
from jaxsocial.train import checkpointing


def _assert_trees_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("value_mode", ["head", "none"])
def test_orbax_round_trip(tmp_path, value_mode):
    pdef, params, ref = tiny_policy(value_mode)
    if value_mode == "head":
        # adaptive KL + running reward stats: every part of the state is non-trivial
        cfg = PPO_SMALL
        prompt, pmask = standard_prompts()
    else:
        cfg = GRPO_LEARN
        prompt, pmask = standard_prompts(group=cfg.group_size)
    update = compiled_update(cfg, value_mode)
    state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(7))
    traj, _ = rollout(pdef, params, ref, cfg, jax.random.PRNGKey(2), prompt, pmask, RESP,
                      count_token(TARGET))
    state, _ = update(state, traj)  # non-trivial optimizer moments, KL coef, stats, key
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    ckpt.save(1, state, {"epoch": 1})
    fresh = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
    restored, meta, _ = ckpt.restore(fresh)
    assert meta == {"epoch": 1}
    _assert_trees_equal(restored, state)
    assert int(restored.step) == cfg.ppo_epochs * cfg.num_minibatches
    # every leaf (params, optimizer moments, KL coef, reward stats, key, counters) is equal,
    # so the pure update continues identically. (Restored arrays are committed to a device:
    # the first update after a restore compiles once more; it does not retrace.)


def test_trajectory_dtypes_and_errors():
    traj = buffer.make_trajectory(np.ones((2, 3), np.int64), np.ones((2, 3)), np.zeros((2, 4)),
                                  np.ones((2, 4)), scores=[0.7, 1])
    assert traj.prompt_tokens.dtype == jnp.int32 and traj.response_mask.dtype == jnp.bool_
    assert traj.scores.dtype == jnp.float32
    assert float(traj.scores[0]) == pytest.approx(0.7)  # not truncated to an int
    assert traj.old_logprobs.dtype == jnp.float32 and traj.old_logprobs.shape == (2, 4)
    with pytest.raises(ValueError, match="scores"):
        buffer.make_trajectory(np.ones((2, 3)), np.ones((2, 3)), np.zeros((2, 4)),
                               np.ones((2, 4)), scores=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="response_mask"):
        buffer.make_trajectory(np.ones((2, 3)), np.ones((2, 3)), np.zeros((2, 4)),
                               np.ones((2, 5)), scores=[1.0, 2.0])


def test_value_mode_is_validated():
    model = llama.Llama(tiny_config(), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="'shared'"):
        policy_lib.init_policy(model, value_mode="shared")


def test_lora_trains_adapters_only_and_reference_is_base():
    model = llama.Llama(tiny_config(), rngs=nnx.Rngs(0))
    lcfg = lora_lib.LoraConfig(rank=4, alpha=8.0)
    pdef, params, ref = policy_lib.init_policy(model, jax.random.PRNGKey(3), lora=lcfg)
    n_adapt = lora_lib.num_params(params["policy"])
    assert 0 < n_adapt < lora_lib.num_params(ref) // 2
    # B = 0: the initial policy equals the base model
    ids, mask = standard_prompts()
    np.testing.assert_array_equal(
        nnx.merge(pdef.graphdef, policy_lib.policy_weights(pdef, params, ref))(ids, mask),
        nnx.merge(pdef.graphdef, ref)(ids, mask))

    cfg = ppo.PPOConfig(learning_rate=1e-2, temperature=1.0, ppo_epochs=2)
    prompt, pmask = standard_prompts()
    state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
    traj, gen_lp = rollout(pdef, params, ref, cfg, jax.random.PRNGKey(2), prompt, pmask, RESP,
                           count_token(TARGET))
    np.testing.assert_allclose(np.asarray(traj.old_logprobs), np.asarray(gen_lp), atol=1e-5)
    new, metrics = ppo.make_update(cfg, pdef)(state, traj)
    assert int(new.nonfinite_skips) == 0
    _assert_trees_equal(new.ref_params, state.ref_params)  # the base is frozen
    q = new.params["policy"]["layers"][0]["self_attn"]["q_proj"]
    assert np.any(np.asarray(q["b"]) != 0)
    # the adapted policy now differs from the reference on the same tokens
    lp, ref_lp, _ = score(pdef, cfg, new.params, new.ref_params, traj)
    assert np.max(np.abs(np.asarray(lp) - np.asarray(ref_lp))) > 1e-4
    np.testing.assert_allclose(np.asarray(ref_lp), np.asarray(traj.ref_logprobs), atol=1e-6)
    with pytest.raises(ValueError, match="rank"):
        lora_lib.LoraConfig(rank=0)
