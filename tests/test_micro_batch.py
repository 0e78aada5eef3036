"""The automatic micro-batch (`rl.micro_batch=0`): rows per gradient micro-batch chosen from
`rl.micro_tokens`, a value the user sets wins, and the epoch trains as with the whole batch at
once, up to float32 rounding."""
import jax
import numpy as np
import pytest
from conftest import load_config_file

from jaxsocial.train import config as run_config
from jaxsocial.train import run as run_lib
from jaxsocial.train import sharding


def rl_block(**kw):
    c = run_config.base_config()
    for k, v in kw.items():
        c.rl[k] = v
    return c


@pytest.mark.parametrize("kw,rows,seq,mesh,want", [
    ({}, 192, 592, (1, 1, 1), 6),              # the demo: 4096 // 592 = 6 rows, 6 | 192
    ({}, 32, 520, (1, 1, 1), 4),               # 7 rows fit the budget, 4 divide 32
    ({}, 192, 592, (8, 1, 1), 48),             # 8 data shards: 8 x 4096 tokens, 8 | 48
    ({}, 12, 592, (8, 1, 1), 6),               # 8 shards cannot split 12 rows: one's budget
    ({}, 16, 10_000, (1, 1, 1), 1),            # a row longer than the budget: one at a time
    ({"micro_tokens": 0}, 192, 592, (1, 1, 1), 192),   # 0: all rows at once
    ({"micro_batch": 32}, 192, 592, (1, 1, 1), 32),    # the user's value wins
    ({"grad_accum_steps": 4}, 192, 592, (1, 1, 1), 0),  # so does the user's accumulation
    ({"prompt_group": 4}, 192, 592, (1, 1, 1), 4),     # whole prompt groups
])
def test_the_micro_batch_is_resolved_from_the_token_budget(kw, rows, seq, mesh, want):
    got = run_config.micro_batch(rl_block(**kw), rows, seq, mesh)
    assert got == want
    if want:
        assert rows % got == 0


def test_the_resolved_micro_batch_reaches_the_rl_config():
    c = load_config_file("configs/demo.py")
    assert c.rl.micro_batch == 0 and c.rl.micro_tokens == run_config.MICRO_TOKENS
    assert run_config.algo_config(c, 16, seq_len=592, mesh_shape=(1, 1, 1)).micro_batch == 6
    assert run_config.algo_config(c, 16).micro_batch == 0  # no sizes: left as set


def _first_epoch(**rl):
    c = load_config_file("configs/demo.py", "smoke")
    c.rl.learning_rate = 1e-3
    for k, v in rl.items():
        c.rl[k] = v
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state, metrics, _ = run.run_epoch(run.init_state())
    return run, jax.device_get(state.train.params), metrics["ppo"]


def test_the_automatic_micro_batch_trains_as_the_whole_batch():
    auto, params, ppo = _first_epoch()
    whole, params_whole, ppo_whole = _first_epoch(micro_tokens=0)
    assert 1 <= auto.setup.rl_config.micro_batch < 32  # demo.py:smoke: 32 rows an epoch
    assert whole.setup.rl_config.micro_batch == 32
    assert ppo["grad_norm"] > 0  # a real update
    for k in ("loss", "policy_loss", "grad_norm", "approx_kl", "entropy"):
        np.testing.assert_allclose(ppo[k], ppo_whole[k], rtol=2e-5, atol=1e-7, err_msg=k)
    # Adam divides by the gradient's own scale, so an element whose gradient is near zero
    # moves by up to ~1e-2 of a step (lr = 1e-3) under reordered sums: atol 1e-5.
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params_whole)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # Control: a different update (half the learning rate) is told apart at this tolerance.
    _, params_half, _ = _first_epoch(learning_rate=5e-4)
    assert not all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in
                   zip(jax.tree.leaves(params_half), jax.tree.leaves(params_whole)))


def test_the_micro_batch_may_change_on_resume():
    # Memory against time only: a run resumed on a smaller machine may use smaller micro-batches.
    c = load_config_file("configs/demo.py", "smoke")
    stored = run_config.as_plain(c)
    c.rl.micro_batch, c.rl.micro_tokens = 8, 1024
    safe, unsafe = run_config.resume_differences(stored, c)
    assert set(safe) == {"rl.micro_batch", "rl.micro_tokens"} and not unsafe
    c.rl.ppo_epochs = 3  # control: a key that changes the update still refuses
    assert "rl.ppo_epochs" in run_config.resume_differences(stored, c)[1]
