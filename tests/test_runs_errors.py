"""Errors a person can read and a readable console:
one-line errors from the launcher, config cross-checks before anything is built, SIGTERM at
any point exits 0, reward.normalize="running" works."""
import errno
import importlib.util
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from absl import flags
from conftest import ONE_DEVICE_ENV, ROOT, load_launcher

from jaxsocial.models import checkpoint_hf, loading
from jaxsocial.train import checkpointing, checks, runner, sharding
from jaxsocial.train import config as run_config
from jaxsocial.train import run as run_lib

SMOKE = os.path.join(ROOT, "configs", "demo.py") + ":smoke"



def load_config(arg="smoke"):
    spec = importlib.util.spec_from_file_location("demo_cfg", os.path.join(ROOT, "configs",
                                                                          "demo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


@pytest.fixture
def launcher():
    mod = load_launcher("launch/train.py")
    yield mod
    flags.FLAGS.unparse_flags()


def _main(mod, capsys, *args, **overrides):
    """Parse flags, apply config overrides ({"model.checkpoint": ...}) and run the launcher's
    main in-process; returns (exit code, "error:" lines, stderr)."""
    mod.parse_flags(["train.py", "--verbose", "--noprogress", f"--config={SMOKE}", *args])
    for key, value in overrides.items():
        section, name = key.split(".")
        mod._CONFIG.value[section][name] = value
    code = 0
    try:
        mod.main([])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.startswith("error:")], err


# ---------------------------------------------------------------------------------------------
# config cross-checks (no model built)


@pytest.mark.parametrize("key,value,named", [
    ("society.feed_size", 64, ("society.feed_size=64", "society.pool_size=32")),
    ("train.epochs", -1, ("train.epochs=-1",)),
    ("reward.normalize", "runing", ("reward.normalize='runing'", "running")),
    ("agents.active_per_tick", 9, ("agents.active_per_tick=9",)),
    ("rollout.decode_buckets", 0, ("rollout.decode_buckets=0", "[1, ")),
    ("reward.non_post_mode", "zero", ("reward.non_post_mode='zero'", "constant, mean, skip")),
    ("reward.non_post_baseline", True, ("reward.non_post_baseline is no longer a key",
                                        "reward.non_post_mode='mean'")),
    ("rl.kl_per", "seq", ("rl.kl_per='seq'", "('token', 'sequence')")),
    ("rl.learning_rate", -1e-3, ("rl.learning_rate=-0.001 must be >= 0",)),
])
def test_config_check_names_the_bad_key(key, value, named):
    checks.check(load_config())  # control: the smoke config passes
    c = load_config()
    section, name = key.split(".")
    c[section][name] = value
    with pytest.raises(ValueError) as e:
        checks.check(c)
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in named), msg
    assert "max_new_tokens" not in msg


def test_kl_per_sequence_is_ppo_only_and_lr_zero_is_allowed():
    c = load_config()
    c.rl.learning_rate = 0.0  # the frozen control of a study
    c.rl.kl_per = "sequence"
    checks.check(c)
    c.rl.algo = "grpo"
    with pytest.raises(ValueError, match="GRPO charges its KL in the loss"):
        checks.check(c)


def test_config_is_checked_before_the_model_is_built(monkeypatch, tmp_path):
    def boom(*a, **k):
        raise AssertionError("model built before the config check")
    monkeypatch.setattr(loading, "load_model", boom)
    monkeypatch.setattr(loading, "load_config", boom)
    c = load_config()
    c.society.feed_size = 64
    with pytest.raises(ValueError, match="feed_size"):
        runner.train(c, str(tmp_path / "w"))
    with pytest.raises(ValueError, match="feed_size"):
        run_lib.build_run(c)


# ---------------------------------------------------------------------------------------------
# one-line errors from the launcher


def test_unknown_config_key_is_one_line(launcher, capsys):
    with pytest.raises(SystemExit) as e:
        launcher.parse_flags(["train.py", f"--config={SMOKE}", "--config.rl.lrr=1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "lrr" in err[0], err


def test_full_disk_is_one_line(launcher, capsys, monkeypatch, tmp_path):
    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpointing.ocp.CheckpointManager, "save", full)
    ck = checkpointing.Checkpointer(str(tmp_path / "direct"))
    with pytest.raises(OSError) as e:
        ck.save(3, {"w": np.ones((4,), np.float32)}, {"epoch": 3})
    assert e.value.errno == errno.ENOSPC and "checkpoint 3" in str(e.value)

    def train(config, workdir, **kw):  # the run logs its first epoch and reaches its save
        (tmp_path / "w" / "metrics.jsonl").write_text('{"epoch": 1}\n')
        checkpointing.Checkpointer(workdir).save(1, {"w": np.ones((4,), np.float32)}, {})
    monkeypatch.setattr(runner, "train", train)
    code, errors, err = _main(launcher, capsys, f"--workdir={tmp_path / 'w'}")
    assert code == 1 and len(errors) == 1, err[-3000:]
    assert "no space left on device while saving checkpoint 1" in errors[0], errors
    # A failure after an epoch is logged is no refusal: the run's files stay.
    assert (tmp_path / "w" / "metrics.jsonl").exists()


# ---------------------------------------------------------------------------------------------
# a refused run leaves no files behind


def test_a_refused_fork_leaves_no_workdir(launcher, capsys, tmp_path):
    source = tmp_path / "source"
    (source / "checkpoints").mkdir(parents=True)
    w = tmp_path / "w"
    code, errors, err = _main(launcher, capsys, f"--workdir={w}", **{
        "train.fork_from": str(source / "checkpoints" / "1")})
    assert code == 1 and len(errors) == 1 and "does not exist" in errors[0], err[-3000:]
    assert not w.exists()


def test_a_refused_feed_size_names_its_key_and_keeps_a_workdir_as_it_was(launcher, capsys,
                                                                         tmp_path):
    w = tmp_path / "w"
    w.mkdir()
    (w / "notes.txt").write_text("mine")
    code, errors, err = _main(launcher, capsys, f"--workdir={w}",
                              **{"society.feed_size": 16})
    assert code == 1 and len(errors) == 1, err[-3000:]
    assert "society.feed_size=16" in errors[0] and "rollout.max_new_tokens" in errors[0], errors
    assert sorted(os.listdir(w)) == ["notes.txt"]


@pytest.mark.parametrize("case", ["fresh", "existing", "epoch_logged", "checkpointed",
                                  "distributed"])
def test_undo_start_takes_back_only_start_up_files(launcher, tmp_path, case):
    w = tmp_path / "w"
    before = launcher._entries(str(w))
    if case != "fresh":
        w.mkdir()
        (w / "notes.txt").write_text("mine")
        before = launcher._entries(str(w))
    (w / "checkpoints").mkdir(parents=True)
    (w / "run.lock").write_text("{}")
    (w / "train.log").write_text("log")
    if case == "epoch_logged":
        (w / "metrics.jsonl").write_text('{"epoch": 1}\n')
    if case == "checkpointed":
        (w / "checkpoints" / "1").mkdir()
    undone = launcher._undo_start(str(w), before, distributed=case == "distributed")
    if case == "fresh":
        assert undone and not w.exists()
    elif case == "existing":
        assert undone and sorted(os.listdir(w)) == ["notes.txt"]
    else:  # controls: an epoch was logged or saved, or peers share the workdir: all kept
        assert not undone
        assert {"checkpoints", "run.lock", "train.log"} <= set(os.listdir(w))


def test_a_refused_run_leaves_no_log_either(tmp_path):
    # Without --verbose the launcher logs into workdir/train.log: a refusal takes it back too.
    w = tmp_path / "w"
    out = subprocess.run([sys.executable, "launch/train.py", "--noprogress", f"--config={SMOKE}",
                          f"--config.train.fork_from={tmp_path / 'src' / 'checkpoints' / '2'}",
                          f"--workdir={w}"], cwd=ROOT, env=ONE_DEVICE_ENV,
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1, out.stderr[-2000:]
    assert "full log" not in errors[0] and not w.exists(), (errors, os.listdir(tmp_path))


def test_truncated_safetensors_is_one_line(launcher, capsys, tmp_path):
    import jax
    from flax import nnx

    from jaxsocial.models import llama
    from jaxsocial.models.tokenizer import tiny_tokenizer
    ckpt = tmp_path / "ckpt"
    checkpoint_hf.save_pretrained(llama.Llama(llama.preset("tiny"), rngs=nnx.Rngs(0)), str(ckpt))
    tiny_tokenizer().save_pretrained(str(ckpt))
    st = ckpt / "model.safetensors"
    os.truncate(st, 1000)
    code, errors, err = _main(launcher, capsys, f"--workdir={tmp_path / 'w'}",
                              **{"model.checkpoint": str(ckpt)})
    assert code == 1 and len(errors) == 1, err[-3000:]
    assert "error:" in errors[0]
    del jax


# ---------------------------------------------------------------------------------------------
# SIGTERM


def test_sigterm_during_set_up_exits_cleanly_and_loses_nothing(monkeypatch, tmp_path):
    c = load_config()
    w = tmp_path / "w"
    w.mkdir()
    (w / "metrics.jsonl").write_text('{"epoch": 1}\n')

    class Killed:
        def __init__(self, config, **kw):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises inside this sleep
            raise AssertionError("SIGTERM did not stop the set-up")
    monkeypatch.setattr(run_lib, "build_run", Killed)
    # --noresume: a workdir with logged epochs but no checkpoint is otherwise refused
    summary = runner.train(c, str(w), resume=False)
    assert summary["stopped"] == "SIGTERM"
    assert (w / "metrics.jsonl").read_text() == '{"epoch": 1}\n'  # nothing cut, nothing lost
    assert signal.getsignal(signal.SIGTERM) is not None


def test_sigterm_early_in_a_real_process_exits_zero(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--config={SMOKE}",
         f"--workdir={tmp_path / 'w'}", "--noprogress"],
        cwd=ROOT, env=ONE_DEVICE_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(3)  # importing / setting up, long before the first epoch
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out.decode()[-3000:]
    assert not (tmp_path / "w" / "checkpoints").exists() or not os.listdir(
        tmp_path / "w" / "checkpoints")


# ---------------------------------------------------------------------------------------------
# reward.normalize="running"


def test_running_normalization_keeps_its_statistics_in_the_state():
    c = load_config()
    c.reward.normalize = "running"
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    assert run.setup.rl_config.reward_norm == "running"
    state = run.init_state()
    state, _, _ = run.run_epoch(state)
    stats = state.train.reward_stats
    assert float(stats.count) == run.setup.active * int(c.rollout.ticks_per_epoch)
    assert np.isfinite(float(stats.var))
    c2 = load_config()  # control: no running statistics without the mode
    assert run_config.algo_config(c2, run.setup.active).reward_norm == "none"


# ---------------------------------------------------------------------------------------------
# console


def test_help_exits_zero_and_a_failed_config_check_writes_nothing(tmp_path):
    out = subprocess.run([sys.executable, "launch/train.py", "--help"], cwd=ROOT,
                         env=ONE_DEVICE_ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "--workdir" in out.stdout, out.stderr[-2000:]
    bad = subprocess.run([sys.executable, "launch/train.py", "--noprogress",
                          f"--config={os.path.join(ROOT, 'configs', 'general.py')}",
                          f"--workdir={tmp_path / 'w'}"], cwd=ROOT, env=ONE_DEVICE_ENV,
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 1 and len(errors) == 1 and "model.checkpoint" in errors[0], \
        bad.stderr[-2000:]
    assert not (tmp_path / "w").exists()  # no workdir, no train.log, no config.json
