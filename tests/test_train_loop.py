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
import optax
import pytest
from conftest import ONE_DEVICE_ENV, TEST_XLA_FLAGS
from flax import nnx

from jaxsocial.models import checkpoint_hf
from jaxsocial.rl import policy as policy_lib
from jaxsocial.train import checkpointing, report, runner, sharding
from jaxsocial.train import run as run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("tokens_per_s", "ticks_per_s", "rollout_s", "wall_s")
# Across device layouts the reductions run in another order: states agree to this
# (relative to each leaf's largest value), not bit-exactly.
# 1 vs 8 devices sum in different orders. Adam's first step moves a weight by about
# lr * g / (|g| + eps): where a gradient is near zero, the order's rounding moves that weight by
# up to ~2e-4 of its leaf's scale on an AMD EPYC and up to ~4e-4 on an Intel Xeon with AVX-512
# (one element of a row-split projection, llama.py). The negative controls move one element by
# 3e-3 of the scale: six times this tolerance.
DEVICE_TOL = dict(rtol=5e-4, atol=5e-4)


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


def adam_moments(opt_state):
    """(mu, nu): the Adam first and second moments inside an optax state."""
    found = [x for x in jax.tree.leaves(opt_state,
                                        is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
             if isinstance(x, optax.ScaleByAdamState)]
    assert len(found) == 1, opt_state
    return found[0].mu, found[0].nu


def trained_parts(train):
    """What one update changes: {"params", "mu", "nu"} of a TrainState, on the host."""
    mu, nu = adam_moments(train.opt_state)
    return sharding.to_host({"params": train.params, "mu": mu, "nu": nu})


def mismatches(a, b, rtol=0.0, atol=0.0):
    """Leaves of two `trained_parts` that differ: |x - y| > atol * max|leaf| + rtol * |y| (the
    absolute part scales with each leaf's magnitude, so one tolerance fits weights and Adam's
    tiny second moments). [] means equal."""
    pa, la = zip(*jax.tree_util.tree_flatten_with_path(a)[0])
    pb, lb = zip(*jax.tree_util.tree_flatten_with_path(b)[0])
    assert pa == pb, "different structures"
    bad = []
    for path, x, y in zip(pa, la, lb):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = max(np.abs(x).max(initial=0.0), np.abs(y).max(initial=0.0))
        if x.shape != y.shape or not np.all(np.abs(x - y) <= atol * scale + rtol * np.abs(y)):
            bad.append(jax.tree_util.keystr(path))
    return bad


def assert_trained(before, after, grad_norm):
    """The update did something: a positive gradient norm, and the parameters and both Adam
    moments moved away from the initial state in most leaves."""
    assert grad_norm > 0, grad_norm
    for part in ("params", "mu", "nu"):
        moved = mismatches(before[part], after[part])
        assert len(moved) >= 0.9 * len(jax.tree.leaves(after[part])), (part, moved)


def perturbed(parts, part="params", delta=3e-3):
    """`parts` with one element of one leaf of `part` moved by `delta` times the leaf's scale
    (a negative control for the comparisons)."""
    leaves, tree = jax.tree.flatten(parts[part])
    x = np.array(leaves[0], np.float64)
    x.flat[0] += delta * max(np.abs(x).max(), 1e-30)
    leaves[0] = x.astype(np.asarray(leaves[0]).dtype)
    return dict(parts, **{part: jax.tree.unflatten(tree, leaves)})


def _restore(run, workdir, step):
    """The RunState of `workdir`'s checkpoint `step`, placed on `run`'s mesh."""
    ckpt = checkpointing.Checkpointer(str(workdir))
    try:
        state, _, _ = ckpt.restore(run.init_state(), step)
    finally:
        ckpt.close()
    return run.place(state)


@pytest.fixture(scope="module")
def smoke():
    c = load_config("demo", "smoke")
    c.train.epochs = 2
    c.mesh.shape = (2, 2, 2)  # 8 fake devices: data x fsdp x tensor
    return c, run_lib.build_run(c)


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
    # Constrained decoding: every answer parses; float32: the rollout's log-probs are the old
    # log-probs (rl.old_logprobs="auto"; test_lora_epoch_trains_adapters_only re-scores them).
    assert all(r["parse_failures"] == 0 for r in recs)
    assert all(r["old_logprobs"] == "rollout" and "logprob_gap" not in r for r in recs)
    # A learning signal: the agents post, the crowd likes some posts, the update moves.
    assert all(r["total_posts"] > 0 and r["reward_mean"] > 0 for r in recs)
    assert recs[0]["avg_likes_per_post"] > 0 and recs[0]["ppo"]["grad_norm"] > 0
    assert sum(recs[0]["action_mix"].values()) == config.agents.num_agents * \
        config.rollout.ticks_per_epoch
    # export/ is a complete HF directory: transformers loads model and tokenizer as they are.
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(full_dir / "export", local_files_only=True)
    assert hf_tok.chat_template and len(hf_tok) == len(run.setup.tokenizer)
    hf_model = AutoModelForCausalLM.from_pretrained(full_dir / "export", local_files_only=True)
    assert hf_model.config.vocab_size == run.setup.model_config.vocab_size
    assert set(hf_model.generation_config.eos_token_id) == set(run.setup.stop_ids)
    assert os.path.exists(full_dir / "samples.jsonl")
    assert any(f.startswith("events") for f in os.listdir(full_dir / "tensorboard"))
    # Text-drift indicators per epoch, and summary.md with the blog's table and real posts.
    assert set(recs[0]["drift"]) == set(report.DRIFT_KEYS)
    assert 0.0 <= recs[0]["drift"]["distinct_2"] <= 1.0
    assert recs[0]["posts"] and all("text" in p and "likes" in p for p in recs[0]["posts"])
    # How far the society's posts spread (social.cascades), per epoch.
    casc = recs[-1]["cascades"]
    assert casc["roots"] > 0 and 0.0 <= casc["spread_share"] <= 1.0
    assert casc["size"]["max"] >= casc["size"]["p50"] >= 0
    pol = recs[-1]["polarisation"]
    assert pol["follow_edges"] > 0 and -1.0 <= pol["homophily"] <= 1.0
    assert -0.5 <= pol["modularity"] <= 1.0 and 0.0 <= pol["split_share"] <= 1.0
    assert 0.0 < pol["exposure_diversity"] <= 2.0
    assert all(-1.0 <= r["persona_sim"] <= 1.0 for r in recs) and recs[0]["persona_sim"] != 0
    md = (full_dir / "summary.md").read_text()
    assert "| avg likes per post |" in md and "## Posts from the last epoch (epoch 2)" in md
    # Interrupted after epoch 1, then resumed: identical metrics (bit-exact on CPU).
    part = runner.train(config, str(tmp_path / "part"), run=run, stop_after=1)
    assert part["epochs"] == 1
    resumed = runner.train(config, str(tmp_path / "part"), run=run)
    assert resumed["epochs"] == 2
    assert _records(tmp_path / "part" / "metrics.jsonl") == recs
    # ... and the same final state: parameters and Adam moments bit-exact, after two updates
    # that really trained (a resume that lost the optimizer state would log the same metrics).
    init = trained_parts(run.init_state().train)
    want = trained_parts(_restore(run, full_dir, 2).train)
    assert recs[0]["ppo"]["grad_norm"] > 0
    assert_trained(init, want, recs[1]["ppo"]["grad_norm"])
    assert mismatches(want, trained_parts(_restore(run, tmp_path / "part", 2).train)) == []
    # Negative controls: the same comparison rejects a resume that drops the optimizer state,
    # one from a different epoch, and a single perturbed weight or moment.
    ep1 = _restore(run, tmp_path / "part", 1)
    fresh_opt = run.init_state().train.opt_state
    dropped, _, _ = run.run_epoch(ep1.replace(train=ep1.train.replace(opt_state=fresh_opt)))
    bad = mismatches(want, trained_parts(dropped.train))
    assert any(b.startswith("['mu']") for b in bad) and any(b.startswith("['nu']") for b in bad)
    assert mismatches(want, trained_parts(_restore(run, full_dir, 1).train))
    for part in ("params", "mu", "nu"):
        assert len(mismatches(want, perturbed(want, part))) == 1, part


def test_general_smoke_free_mode_counts_unparsable(tmp_path):
    c = load_config("general", "smoke")
    c.agents.action_mode = "free"
    c.train.export_hf = False
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    summary = runner.train(c, str(tmp_path / "free"), run=run)
    rec = _records(tmp_path / "free" / "metrics.jsonl")[0]
    # general.py's activation: 4 of the 8 agents act each simulated hour, for 8 hours.
    assert c.agents.activation.enabled and rec["interactions"] == 8 * 4
    # A random tiny model writing free text almost never starts with an action keyword.
    assert rec["parse_failures"] > 0
    assert rec["action_mix"].get("malformed", 0) == rec["parse_failures"]
    assert summary["epochs"] == 1


def test_general_without_checkpoint_is_a_clear_error():
    c = load_config("general")
    with pytest.raises(ValueError, match="--config.model.checkpoint=.*configs/demo.py"):
        run_lib.build_run(c)


def _one_epoch(run):
    """(metrics, trained parts before, trained parts after) of the first epoch of `run`."""
    state = run.init_state()
    before = trained_parts(state.train)
    state, metrics, _ = run.run_epoch(state)
    return metrics, before, trained_parts(state.train)


@pytest.fixture(scope="module")
def eight_device_epoch(smoke):
    assert smoke[1].mesh.devices.size == 8
    return _one_epoch(smoke[1])


def test_same_epoch_on_one_and_eight_devices(smoke, eight_device_epoch):
    config, _ = smoke
    run1 = run_lib.build_run(config, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    (m1, init1, t1), (m8, init8, t8) = _one_epoch(run1), eight_device_epoch
    for k in ("avg_likes_per_post", "total_posts", "parse_failures", "zero_like_share"):
        assert m1[k] == m8[k], k
    assert m1["action_mix"] == m8["action_mix"]
    np.testing.assert_allclose(m1["reward_mean"], m8["reward_mean"], rtol=1e-5)
    np.testing.assert_allclose(m1["ppo"]["grad_norm"], m8["ppo"]["grad_norm"], rtol=1e-4)
    # Same start, a real update on both, and the same parameters and Adam moments after it.
    assert mismatches(init1, init8) == []
    assert_trained(init1, t1, m1["ppo"]["grad_norm"])
    assert_trained(init8, t8, m8["ppo"]["grad_norm"])
    assert mismatches(t1, t8, **DEVICE_TOL) == []
    # Negative controls: one weight or moment off by 0.3% of its leaf's scale, or the
    # untrained state, is rejected by the same comparison.
    for part in ("params", "mu", "nu"):
        assert mismatches(t1, perturbed(t8, part), **DEVICE_TOL), part
    assert mismatches(t1, init8, **DEVICE_TOL)


def test_scanned_layers_give_the_same_epoch_on_eight_devices(smoke, eight_device_epoch):
    """`model.scan_layers` (the layers as one lax.scan, the KV cache one stacked buffer) on the
    (2, 2, 2) mesh: the unrolled model's epoch (rollout, rewards, update), with negative
    controls."""
    config, _ = smoke
    config = config.copy_and_resolve_references()
    config.model.scan_layers = True
    run = run_lib.build_run(config)
    assert run.setup.model_config.scan_layers and run.mesh.devices.size == 8
    (ms, inits, ts), (m8, init8, t8) = _one_epoch(run), eight_device_epoch
    for k in ("avg_likes_per_post", "total_posts", "parse_failures", "action_mix"):
        assert ms[k] == m8[k], k
    np.testing.assert_allclose(ms["ppo"]["grad_norm"], m8["ppo"]["grad_norm"], rtol=1e-4)
    assert mismatches(inits, init8) == []
    assert_trained(inits, ts, ms["ppo"]["grad_norm"])
    assert mismatches(ts, t8, **DEVICE_TOL) == []
    for part in ("params", "mu", "nu"):
        assert mismatches(ts, perturbed(t8, part), **DEVICE_TOL), part


def test_sigint_saves_a_checkpoint_and_exits_zero(tmp_path):
    """Ctrl-C in a real process (SIGTERM takes the same handler: test_runs_resume)."""
    workdir = tmp_path / "sig"
    env = dict(ONE_DEVICE_ENV, PYTHONUNBUFFERED="1")
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
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.decode()[-3000:]
    steps = os.listdir(workdir / "checkpoints")
    n_epochs = len(metrics.read_text().splitlines())
    assert str(n_epochs) in steps
    assert f"stopped by SIGINT after epoch {n_epochs} of 1000: checkpointed" in out.decode()


HEARTBEAT_S = 10


def test_two_processes_agree_with_one_and_a_lost_one_is_one_line(smoke, smoke_full, tmp_path):
    """jax.distributed over localhost: 2 processes x 4 fake CPU devices, (2, 2, 2) mesh, 2 epochs.
    Epoch 1 (metrics and checkpoint) equals the one-process run's. Then process 1 is killed
    during epoch 2: process 0 exits 1 within the heartbeat timeout with one `error:` line naming
    it and checkpoint 1 (jaxsocial.train.peers; its unit tests: tests/test_runs_lost_host.py).
    One launch serves both: each multi-process launch compiles its epoch in every process, and
    JAX's persistent cache does not serve multi-process programs."""
    from jaxsocial.train import peers
    _, run = smoke
    _, full_dir, recs = smoke_full
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tmp_path / "mh"
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
               XLA_FLAGS=TEST_XLA_FLAGS + " --xla_force_host_platform_device_count=4")
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"),
         "--config=" + os.path.join(ROOT, "configs", "demo.py") + ":smoke",
         "--config.train.epochs=2", "--config.train.checkpoint_every=1",
         "--config.train.export_hf=False",
         "--config.mesh.shape=(2,2,2)", "--config.distributed.enabled=True",
         f"--config.distributed.coordinator_address=127.0.0.1:{port}",
         "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}",
         f"--workdir={workdir}", "--noprogress", f"--heartbeat_timeout={HEARTBEAT_S}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    try:
        ckpt = workdir / "checkpoints" / "1"
        deadline = time.time() + 500
        while not ckpt.is_dir():
            assert time.time() < deadline, "no checkpoint 1"
            for p in procs:
                assert p.poll() is None, p.communicate()[1][-3000:]
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.time()
        procs[0].wait(timeout=HEARTBEAT_S + 60)
        took = time.time() - killed
        out, err = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    log = (workdir / "train.log").read_text()
    # The lost process: one line, within the heartbeat timeout, naming checkpoint 1.
    assert procs[0].returncode == 1, (err[-3000:], log[-3000:])
    assert took < HEARTBEAT_S + 20, took  # the service's verdict comes within the timeout
    assert peers.checkpoint_steps(str(workdir)) == [1]  # killed during epoch 2
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [
        f"error: lost process 1 of 2: no heartbeat reached the coordination service for "
        f"{HEARTBEAT_S} s (killed, crashed, failed or its host went down; its log: "
        f"{workdir}/train.1.log); process 0 stops too; resume from checkpoint 1 by rerunning "
        f"the same commands on every process (full log: {workdir}/train.log)"], err[-3000:]
    assert "Terminating process" not in err and "Fatal Python error" not in err
    assert "Terminating process because the JAX distributed service" in log  # the reason, kept
    # Epoch 1 of the two processes equals the one-process run's.
    got = _records(workdir / "metrics.jsonl")
    assert len(got) == 1
    for k in ("avg_likes_per_post", "total_posts", "parse_failures", "action_mix"):
        assert got[0][k] == recs[0][k], k
    np.testing.assert_allclose(got[0]["reward_mean"], recs[0]["reward_mean"], rtol=1e-5)
    np.testing.assert_allclose(got[0]["ppo"]["loss"], recs[0]["ppo"]["loss"], rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(got[0]["ppo"]["grad_norm"], recs[0]["ppo"]["grad_norm"],
                               rtol=1e-4)
    # The state the two processes saved: a real update, equal to the one-process run's.
    init = trained_parts(run.init_state().train)
    mh = trained_parts(_restore(run, workdir, 1).train)
    one = trained_parts(_restore(run, full_dir, 1).train)
    assert_trained(init, mh, got[0]["ppo"]["grad_norm"])
    assert mismatches(one, mh, **DEVICE_TOL) == []
    # Negative controls: another epoch's state, or one perturbed weight / moment, is rejected.
    assert mismatches(trained_parts(_restore(run, full_dir, 2).train), mh, **DEVICE_TOL)
    for part in ("params", "mu", "nu"):
        assert mismatches(one, perturbed(mh, part), **DEVICE_TOL), part


def test_lora_epoch_trains_adapters_only(tmp_path):
    c = load_config("demo", "smoke")
    c.rl.lora_rank = 4
    c.rl.old_logprobs = "rescore"  # and the rollout's log-probs equal a re-scoring
    c.mesh.shape = (1, 1, 1)
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state = run.init_state()
    ref_before = jax.device_get(state.train.ref_params)
    adapters_before = jax.device_get(state.train.params["policy"])
    state, metrics, _ = run.run_epoch(state)
    assert metrics["parse_failures"] == 0 and metrics["old_logprobs"] == "rescore"
    assert metrics["logprob_gap"] < 1e-5
    # The smoke epoch's posts earn likes: non-zero advantages, so the adapters get gradients.
    assert metrics["total_posts"] > 0 and metrics["reward_mean"] > 0
    assert metrics["ppo"]["grad_norm"] > 0
    # The base (= reference) is frozen; only adapters (and the value head) move.
    for a, b in zip(jax.tree.leaves(ref_before), jax.tree.leaves(state.train.ref_params)):
        np.testing.assert_array_equal(a, b)
    moved = [not np.allclose(a, b) for a, b in
             zip(jax.tree.leaves(adapters_before), jax.tree.leaves(state.train.params["policy"]))]
    assert any(moved)
    # The export holds the merged weights: its logits are the adapted forward's, not the base's.
    run.export_policy(state, str(tmp_path / "export"))
    ids = jnp.arange(3, 19).reshape(2, 8)
    exported = checkpoint_hf.from_pretrained(str(tmp_path / "export"))(ids)
    train, pdef = state.train, run.setup.pdef
    adapted = nnx.merge(pdef.graphdef, policy_lib.policy_weights(pdef, train.params,
                                                                 train.ref_params))(ids)
    base = nnx.merge(pdef.graphdef, train.ref_params)(ids)
    np.testing.assert_allclose(exported, adapted, atol=1e-5)
    assert not np.allclose(exported, base, atol=1e-5)


def test_a_random_subset_of_agents_acts_each_tick():
    c = load_config("demo", "smoke")
    c.agents.active_per_tick = 2
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state = run.init_state()
    key = jax.random.key(3)
    soc, ro = run.rollout(state.train.params, state.train.ref_params, state.society, key)
    agents = np.asarray(ro.agent)
    assert agents.shape == (c.rollout.ticks_per_epoch, 2) and ro.tokens.shape[1] == 2
    assert all(len(set(row)) == 2 and set(row) <= set(range(c.agents.num_agents))
               for row in agents)
    # Each created post is authored by the agent whose trajectory created it.
    created = np.asarray(ro.created_id)
    alive = np.asarray(soc.posts.alive(jnp.asarray(created)))
    authors = np.asarray(soc.posts.author)[np.maximum(created, 0) % soc.posts.capacity]
    assert ((authors == agents) | ~alive).all()
    too_many = c.agents.num_agents + 1
    with pytest.raises(ValueError, match=f"active_per_tick={too_many}"):
        c.agents.active_per_tick = too_many
        run_lib.build_run(c)
