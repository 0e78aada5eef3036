"""One compiled program per epoch (`Run.epoch`) against the three-program path."""
import jax
import numpy as np
from conftest import load_config_file
from test_train_loop import assert_trained, mismatches, perturbed, trained_parts

from jaxsocial.train import run as run_lib
from jaxsocial.train import sharding

TIMING = ("tokens_per_s", "ticks_per_s", "rollout_s", "wall_s", "fused_epoch")
# The fused and the three-program epochs are different XLA programs whose fusions round
# differently; Adam turns that into up to ~3e-6 of a leaf's scale where a gradient is near zero
# (embedding rows of unused tokens). The negative controls move one element by 3e-3 of the scale.
TOL = dict(rtol=1e-5, atol=1e-5)


def _run(fused, seed=0):
    c = load_config_file("configs/demo.py", "smoke")
    c.train.fused_epoch = fused
    c.seed = seed
    return run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))


def _strip(m):
    m = {k: v for k, v in m.items() if k not in TIMING}
    ppo = m.pop("ppo")
    return m, ppo


def test_one_program_epoch_matches_three_programs_and_compiles_once():
    fused, three = _run(True), _run(False)
    assert fused.setup.fused and not three.setup.fused
    s_f, s_t = fused.init_state(), three.init_state()
    init = trained_parts(s_f.train)
    assert mismatches(init, trained_parts(s_t.train)) == []
    s_f, m_f, samples_f = fused.run_epoch(s_f)
    s_t, m_t, samples_t = three.run_epoch(s_t)
    assert m_f["fused_epoch"] and not m_t["fused_epoch"]
    (a, ppo_f), (b, ppo_t) = _strip(m_f), _strip(m_t)
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float):
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, err_msg=k)
        else:
            assert a[k] == b[k], k
    for k in ppo_f:
        np.testing.assert_allclose(ppo_f[k], ppo_t[k], rtol=1e-4, atol=1e-7, err_msg=k)
    assert samples_f == samples_t
    # A real update on both paths, to the same parameters and Adam moments.
    t_f, t_t = trained_parts(s_f.train), trained_parts(s_t.train)
    assert m_f["total_posts"] > 0
    assert_trained(init, t_f, ppo_f["grad_norm"])
    assert mismatches(t_f, t_t, **TOL) == []
    for part in ("params", "mu", "nu"):  # negative control: a 0.1% change is caught
        assert mismatches(t_f, perturbed(t_t, part), **TOL), part
    # The society and the loop key moved on identically.
    np.testing.assert_array_equal(sharding.to_host(s_f.key), sharding.to_host(s_t.key))
    np.testing.assert_array_equal(sharding.to_host(s_f.society.posts.id),
                                  sharding.to_host(s_t.society.posts.id))
    # A second epoch reuses the compiled program; the epoch counter advances.
    s_f, m2, _ = fused.run_epoch(s_f)
    assert fused.traces.count == 1 and m2["epoch"] == 2
    # Negative control: another seed's epoch is a different run.
    other = _run(True, seed=1)
    s_o, _, _ = other.run_epoch(other.init_state())
    assert mismatches(t_f, trained_parts(s_o.train), **TOL)


def test_a_host_side_reward_keeps_three_programs():
    c = load_config_file("configs/demo.py", "smoke")
    c.code.enabled = True
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    assert not run.setup.fused


def test_old_values_from_the_rollout_match_the_scoring_forward():
    """rl.old_values="rollout" (the value head over the generator's hidden states, no scoring
    forward for the values): two epochs agree with the default path (the first epoch's head is
    zero-initialised, so the second, whose values are non-zero, is the real comparison), and
    the metrics say where the values came from. Negative control: one weight moved by 0.3% of its
    leaf's scale is caught by the same comparison."""
    runs = {}
    for mode in ("rescore", "rollout"):
        c = load_config_file("configs/demo.py", "smoke")
        c.rl.old_values = mode
        run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
        assert run.setup.old_values == mode
        s = run.init_state()
        s, m1, _ = run.run_epoch(s)
        assert m1.get("old_values", "rescore") == mode
        s, m2, _ = run.run_epoch(s)
        runs[mode] = (s, m2)
    (s_a, m2_a), (s_b, m2_b) = runs["rescore"], runs["rollout"]
    assert "old_values" not in m2_a and m2_b["old_values"] == "rollout"
    head = sharding.to_host(s_a.train.params["value"]["head"]["kernel"])
    assert np.abs(head).max() > 0  # epoch 2's values were not all zero
    for k in m2_a["ppo"]:
        np.testing.assert_allclose(m2_b["ppo"][k], m2_a["ppo"][k], rtol=1e-3, atol=1e-6,
                                   err_msg=k)
    assert m2_a["ppo"]["grad_norm"] > 0
    a, b = trained_parts(s_a.train), trained_parts(s_b.train)
    assert mismatches(b, a, rtol=1e-4, atol=1e-4) == []
    assert mismatches(b, perturbed(a), rtol=1e-4, atol=1e-4)
