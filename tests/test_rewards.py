"""Social reward = engagement within a horizon, checked against a hand-built society history."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.rl import rewards


def _reference(created_id, created_tick, deltas, slot_ids, horizon, first_tick):
    """Plain loop over ticks: a post earns while it is alive and younger than the horizon."""
    t_n, p, e = deltas.shape
    out = np.zeros((len(created_id), e))
    for m, (c, t0) in enumerate(zip(created_id, created_tick)):
        if c < 0:
            continue
        for i in range(t_n):
            tick = first_tick + i
            if t0 <= tick < t0 + horizon and slot_ids[i, c % p] == c:
                out[m] += deltas[i, c % p]
    return out


def test_hand_built_history_with_eviction():
    # Ring of 2 slots. Post 0 (slot 0) created at tick 0; post 1 (slot 1) at tick 0;
    # post 2 is created at tick 2 in slot 0, evicting post 0 before its horizon (3) ends.
    horizon = 3
    slot_ids = np.array([[0, 1], [0, 1], [2, 1], [2, 1]])
    likes = np.array([[1, 0], [2, 1], [5, 1], [1, 4]])
    deltas = likes[..., None]
    created_id = np.array([0, 1, 2, -1])
    created_tick = np.array([0, 0, 2, 0])
    got = rewards.engagement_within_horizon(jnp.asarray(created_id), jnp.asarray(created_tick),
                                            jnp.asarray(deltas), jnp.asarray(slot_ids), horizon)
    # post 0: ticks 0, 1 (evicted at 2) -> 1 + 2; post 1: ticks 0..2 -> 0 + 1 + 1;
    # post 2: ticks 2, 3 -> 5 + 1; no post -> 0.
    np.testing.assert_allclose(np.asarray(got)[:, 0], [3, 2, 6, 0])


@pytest.mark.parametrize("seed", [0, 1])
def test_random_histories_match_the_loop(seed):
    rng = np.random.default_rng(seed)
    t_n, p, e, m, horizon, first = 9, 5, 3, 12, 4, 7
    slot_ids = rng.integers(0, 15, size=(t_n, p))
    deltas = rng.integers(0, 4, size=(t_n, p, e))
    created_id = rng.integers(-1, 15, size=m)
    created_tick = rng.integers(first - 2, first + t_n, size=m)
    got = rewards.engagement_within_horizon(
        jnp.asarray(created_id), jnp.asarray(created_tick), jnp.asarray(deltas),
        jnp.asarray(slot_ids), horizon, first_tick=first)
    np.testing.assert_allclose(np.asarray(got),
                               _reference(created_id, created_tick, deltas, slot_ids, horizon,
                                          first))


def test_followers_within_horizon_and_normalisation():
    delta = np.array([[1, 0], [0, 2], [3, 0]])
    got = rewards.followers_within_horizon(jnp.asarray([0, 1, 0]), jnp.asarray([1, 0, 0]),
                                           jnp.asarray(delta), horizon=2,
                                           valid=jnp.asarray([True, True, False]))
    np.testing.assert_allclose(np.asarray(got), [3, 2, 0])
    x = jnp.asarray([1.0, 2.0, 3.0, 6.0])
    w = rewards.normalize_scores(x, "whiten")
    assert abs(float(w.mean())) < 1e-6 and abs(float(w.std()) - 1) < 1e-4
    with pytest.raises(ValueError, match="'zscore'"):
        rewards.normalize_scores(x, "zscore")
