"""Agent activation over the society's 24-hour clock (jaxsocial.social.activation)."""
import dataclasses
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config_file

from jaxsocial.social import activation
from jaxsocial.social.state import SocialParams
from jaxsocial.train import epoch, sharding
from jaxsocial.train import run as run_lib


def test_hour_of_tick_matches_the_wall_clock():
    for start, spt in [(1_700_000_000, 3600), (1_700_000_123, 1234), (0, 86_399), (5, 7)]:
        p = SocialParams(start_seconds=start, seconds_per_tick=spt)
        ticks = np.concatenate([np.arange(200), [86_399, 86_400, 10**6, 2**31 - 1]])
        got = np.asarray(jax.vmap(lambda t: activation.hour_of_tick(t, p))(
            jnp.asarray(ticks, jnp.int32)))
        want = [((start + int(t) * spt) % 86_400) // 3600 for t in ticks]
        np.testing.assert_array_equal(got, want)


def _top_decile_share(w):
    mean = np.sort(np.asarray(w).mean(1))[::-1]
    return mean[: len(mean) // 10].sum() / mean.sum()


def test_profile_is_heavy_tailed_and_daily():
    key = jax.random.key(0)
    w = np.asarray(activation.make_profile(key, 2000, sigma=1.0, diurnal_amplitude=0.8,
                                           peak_hour=20.0, peak_spread=2.0))
    assert w.shape == (2000, 24) and w.dtype == np.float32
    assert w.min() > 0 and w.max() == pytest.approx(1.0)
    # Log-normal sigma=1: the top 10% of agents hold ~39% of the activity (uniform: 10%).
    assert 0.3 < _top_decile_share(w) < 0.5
    flat = activation.make_profile(key, 2000, sigma=0.0)  # negative control: no tail
    assert _top_decile_share(flat) < 0.12
    # Evening peak vs morning trough, averaged over agents.
    assert w[:, 20].mean() > 3 * w[:, 8].mean()
    assert np.ptp(np.asarray(activation.make_profile(key, 50, diurnal_amplitude=0.0)),
                  axis=1).max() < 1e-6


def _inclusion_reference(w, b):
    """P(agent i is among b draws without replacement, each draw proportional to w): sum over
    ordered draws (pure Python)."""
    w = [float(x) for x in w]
    p = [0.0] * len(w)
    for seq in itertools.permutations(range(len(w)), b):
        prob, left = 1.0, sum(w)
        for i in seq:
            prob *= w[i] / left
            left -= w[i]
        for i in seq:
            p[i] += prob
    return np.asarray(p)


def test_sample_active_draws_by_weight_without_replacement():
    w = jnp.asarray([0.05, 0.1, 0.2, 0.3, 0.35, 0.0])
    b, n = 2, 40_000
    draws = np.asarray(jax.vmap(lambda k: activation.sample_active(k, w, b))(
        jax.random.split(jax.random.key(1), n)))
    assert draws.shape == (n, b)
    assert (np.diff(draws, axis=1) > 0).all()  # distinct and sorted
    assert not (draws == 5).any()  # weight 0: never while two others are positive
    freq = np.bincount(draws.ravel(), minlength=6) / n
    ref = _inclusion_reference(np.asarray(w), b)
    np.testing.assert_allclose(freq, ref, atol=0.01)
    # Negative control: a uniform subset (the old rule) is far from the reference.
    assert np.abs(ref[:5] - b / 5).max() > 0.1


def test_load_profile_cycles_rows_and_names_bad_files(tmp_path):
    rows = np.arange(48, dtype=np.float32).reshape(2, 24)
    (tmp_path / "p.json").write_text(json.dumps(rows.tolist()))
    np.save(tmp_path / "p.npy", rows)
    for name in ("p.json", "p.npy"):
        got = activation.load_profile(str(tmp_path / name), 5)
        np.testing.assert_array_equal(got, rows[[0, 1, 0, 1, 0]])
    (tmp_path / "bad.json").write_text(json.dumps([[1.0] * 23]))
    with pytest.raises(ValueError, match=r"bad.json.*\[n, 24\].*\[1, 23\]"):
        activation.load_profile(str(tmp_path / "bad.json"), 5)
    (tmp_path / "neg.json").write_text(json.dumps([[-1.0] * 24]))
    with pytest.raises(ValueError, match="neg.json"):
        activation.load_profile(str(tmp_path / "neg.json"), 5)
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        activation.load_profile(str(tmp_path / "missing.npy"), 5)


def _smoke(active=4):
    c = load_config_file("configs/demo.py", "smoke")
    c.agents.active_per_tick = active
    c.agents.activation.enabled = True
    return c


def test_the_rollout_draws_its_agents_from_the_hours_profile():
    c = _smoke()
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    assert run.setup.activation.shape == (c.agents.num_agents, 24)
    # Even hours: only even agents may act; odd hours: only odd ones (4 of each, B = 4).
    hours, agents = np.arange(24), np.arange(c.agents.num_agents)
    setup = dataclasses.replace(
        run.setup, activation=((hours[None, :] % 2) == (agents[:, None] % 2)).astype(np.float32))
    fns = epoch.make_epoch(setup)  # the pure functions read the set-up when built
    state = run.init_state()
    _, ro = jax.jit(fns.rollout)(state.train.params, state.train.ref_params, state.society,
                                 jax.random.key(3), grammar=run.setup.grammar,
                                 encoder=run.encoder)
    hour = [int(activation.hour_of_tick(t, run.setup.social_params)) for t in np.asarray(ro.tick)]
    assert len(set(h % 2 for h in hour)) == 2  # both parities occur in the epoch
    for h, row in zip(hour, np.asarray(ro.agent)):
        assert sorted(row) == [i for i in agents if i % 2 == h % 2], (h, row)


@pytest.mark.parametrize("change, message", [
    (dict(active_per_tick=0), "agents.activation.enabled needs 0 < agents.active_per_tick"),
    (dict(active_per_tick=8), "agents.activation.enabled needs 0 < agents.active_per_tick"),
    (dict(diurnal_amplitude=1.0), "agents.activation.diurnal_amplitude=1.0"),
    (dict(sigma=-1.0), "agents.activation.sigma=-1.0"),
])
def test_bad_activation_configs_are_named(change, message):
    c = _smoke()
    for k, v in change.items():
        if k == "active_per_tick":
            c.agents.active_per_tick = v
        else:
            c.agents.activation[k] = v
    with pytest.raises(ValueError, match=message):
        run_lib.build_run(c)
