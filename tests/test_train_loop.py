"""The Social-RL loop end to end: smoke configs, resume exactness, SIGTERM, 1 vs 8 devices."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.train import loop, runner, sharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("tokens_per_s", "ticks_per_s", "rollout_s", "wall_s")


def load_config(name, arg=None):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


def _records(path):
    out = []
    for line in open(path):
        r = json.loads(line)
        for k in TIMING:
            r.pop(k)
        out.append(r)
    return out


@pytest.fixture(scope="module")
def smoke():
    c = load_config("demo", "smoke")
    c.train.epochs = 2
    c.mesh.shape = (2, 2, 2)  # 8 fake devices: data x fsdp x tensor
    return c, loop.SocialRL(c)


@pytest.fixture(scope="module")
def smoke_full(smoke, tmp_path_factory):
    config, run = smoke
    workdir = tmp_path_factory.mktemp("full")
    summary = runner.train(config, str(workdir), run=run)
    return summary, workdir, _records(workdir / "metrics.jsonl")


def test_demo_smoke_runs_end_to_end_and_resumes_exactly(smoke, smoke_full, tmp_path):
    config, run = smoke
    full, full_dir, recs = smoke_full
    assert full["epochs"] == 2
    assert [r["epoch"] for r in recs] == [1, 2]
    for k in ("avg_likes_per_post", "zero_like_share", "total_posts", "parse_failures",
              "reward_mean", "positive_engagement_share", "action_mix"):
        assert k in recs[0]
    # Constrained decoding: every answer parses; log-probs re-scored exactly.
    assert all(r["parse_failures"] == 0 for r in recs)
    assert all(r["logprob_gap"] < 1e-4 for r in recs)
    assert sum(recs[0]["action_mix"].values()) == config.agents.num_agents * \
        config.rollout.ticks_per_epoch
    assert os.path.exists(full_dir / "export" / "model.safetensors")
    assert os.path.exists(full_dir / "samples.jsonl")
    assert any(f.startswith("events") for f in os.listdir(full_dir / "tensorboard"))
    # Interrupted after epoch 1, then resumed: identical metrics (bit-exact on CPU).
    part = runner.train(config, str(tmp_path / "part"), run=run, stop_after=1)
    assert part["epochs"] == 1
    resumed = runner.train(config, str(tmp_path / "part"), run=run)
    assert resumed["epochs"] == 2
    assert _records(tmp_path / "part" / "metrics.jsonl") == recs


def test_general_smoke_free_mode_counts_unparsable(tmp_path):
    c = load_config("general", "smoke")
    c.agents.action_mode = "free"
    c.train.export_hf = False
    summary = runner.train(c, str(tmp_path / "free"))
    rec = _records(tmp_path / "free" / "metrics.jsonl")[0]
    # A random tiny model writing free text almost never starts with an action keyword.
    assert rec["parse_failures"] > 0
    assert rec["action_mix"].get("malformed", 0) == rec["parse_failures"]
    assert summary["epochs"] == 1


def test_general_without_checkpoint_is_a_clear_error():
    c = load_config("general")
    with pytest.raises(ValueError, match="--config.model.checkpoint=.*configs/demo.py"):
        loop.SocialRL(c)


def test_same_epoch_on_one_and_eight_devices(smoke):
    config, run8 = smoke
    assert run8.mesh.devices.size == 8
    run1 = loop.SocialRL(config, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    results = []
    for run in (run1, run8):
        state = run.init_state()
        state, metrics, _ = run.run_epoch(state)
        results.append((metrics, jax.device_get(state.train.params)))
    (m1, p1), (m8, p8) = results
    for k in ("avg_likes_per_post", "total_posts", "parse_failures", "zero_like_share"):
        assert m1[k] == m8[k], k
    assert m1["action_mix"] == m8["action_mix"]
    np.testing.assert_allclose(m1["reward_mean"], m8["reward_mean"], rtol=1e-5)
    flat1, flat8 = jax.tree.leaves(p1), jax.tree.leaves(p8)
    assert len(flat1) == len(flat8)
    for a, b in zip(flat1, flat8):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path):
    workdir = tmp_path / "sig"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"),
         "--config=" + os.path.join(ROOT, "configs", "demo.py") + ":smoke",
         "--config.train.epochs=1000", "--config.train.checkpoint_every=1000",
         f"--workdir={workdir}", "--noprogress"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        metrics = workdir / "metrics.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline and not (metrics.exists() and metrics.read_text()):
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.decode()[-3000:]
    steps = os.listdir(workdir / "checkpoints")
    n_epochs = len(metrics.read_text().splitlines())
    assert str(n_epochs) in steps


def test_two_processes_agree_with_one(smoke_full, tmp_path):
    """jax.distributed over localhost: 2 processes x 4 fake CPU devices, (2, 2, 2) mesh."""
    _, _, recs = smoke_full
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    try:
        for i in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "launch", "train.py"),
                 "--config=" + os.path.join(ROOT, "configs", "demo.py") + ":smoke",
                 "--config.train.epochs=1", "--config.train.export_hf=False",
                 "--config.mesh.shape=(2,2,2)", "--config.distributed.enabled=True",
                 f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                 "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}",
                 f"--workdir={tmp_path / 'mh'}", "--noprogress"],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs = [p.communicate(timeout=600)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    got = _records(tmp_path / "mh" / "metrics.jsonl")
    assert len(got) == 1
    for k in ("avg_likes_per_post", "total_posts", "parse_failures", "action_mix"):
        assert got[0][k] == recs[0][k], k
    np.testing.assert_allclose(got[0]["reward_mean"], recs[0]["reward_mean"], rtol=1e-5)
    np.testing.assert_allclose(got[0]["ppo"]["loss"], recs[0]["ppo"]["loss"], rtol=1e-4,
                               atol=1e-6)
    assert "1" in os.listdir(tmp_path / "mh" / "checkpoints")


def test_lora_epoch_trains_adapters_only():
    c = load_config("demo", "smoke")
    c.rl.lora_rank = 4
    c.mesh.shape = (1, 1, 1)
    # A score that differs between answers (the smoke society is too small for likes), so the
    # advantages, and hence the adapter gradients, are non-zero.
    c.reward.non_post_baseline = False
    c.reward.non_post = 1.0
    run = loop.SocialRL(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state = run.init_state()
    ref_before = jax.device_get(state.train.ref_params)
    adapters_before = jax.device_get(state.train.params["policy"])
    state, metrics, _ = run.run_epoch(state)
    assert metrics["parse_failures"] == 0 and metrics["logprob_gap"] < 1e-4
    # The base (= reference) is frozen; only adapters (and the value head) move.
    for a, b in zip(jax.tree.leaves(ref_before), jax.tree.leaves(state.train.ref_params)):
        np.testing.assert_array_equal(a, b)
    moved = [not np.allclose(a, b) for a, b in
             zip(jax.tree.leaves(adapters_before), jax.tree.leaves(state.train.params["policy"]))]
    assert any(moved)


def test_a_random_subset_of_agents_acts_each_tick():
    c = load_config("demo", "smoke")
    c.agents.active_per_tick = 2
    run = loop.SocialRL(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state = run.init_state()
    key = jax.random.key(3)
    soc, ro = run._rollout(state.train.params, state.train.ref_params, state.society, key)
    agents = np.asarray(ro.agent)
    assert agents.shape == (c.rollout.ticks_per_epoch, 2) and ro.tokens.shape[1] == 2
    assert all(len(set(row)) == 2 and set(row) <= set(range(4)) for row in agents)
    # Each created post is authored by the agent whose trajectory created it.
    created = np.asarray(ro.created_id)
    alive = np.asarray(soc.posts.alive(jnp.asarray(created)))
    authors = np.asarray(soc.posts.author)[np.maximum(created, 0) % soc.posts.capacity]
    assert ((authors == agents) | ~alive).all()
    with pytest.raises(ValueError, match="active_per_tick=5"):
        c.agents.active_per_tick = 5
        loop.SocialRL(c)


def test_setup_warns_when_the_run_cannot_fit(monkeypatch, caplog):
    from jaxsocial.train import memory
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: 1024)  # a 1 KiB "device"
    c = load_config("demo", "smoke")
    with caplog.at_level("WARNING"):
        loop.SocialRL(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    assert any("exceeds" in r.getMessage() for r in caplog.records)
