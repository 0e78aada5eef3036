"""Runs that cannot trample each other or themselves: the workdir lock, workdirs that cannot
be written, non-finite weights refused at load and at export, and the export check that decides
whether a finished run's outputs are whole."""
import os
import signal
import socket
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ONE_DEVICE_ENV, ROOT, hold_lock_in_another_process, load_config_file
from flax import nnx

from jaxsocial.models import checkpoint_hf, hf_layout, llama, loading
from jaxsocial.models.tokenizer import tiny_tokenizer
from jaxsocial.train import checkpointing, runner, workdir_lock
from jaxsocial.train import run as run_lib

SMOKE = os.path.join(ROOT, "configs", "demo.py") + ":smoke"


class Built(Exception):
    """Raised by a stand-in build_run: the run got past the lock to building the model."""


@pytest.fixture
def no_model(monkeypatch):
    def built(config, **kw):
        raise Built()
    monkeypatch.setattr(run_lib, "build_run", built)


def _hold_in_another_process(workdir):
    """A live process holding `workdir`'s lock (as a running trainer does)."""
    return hold_lock_in_another_process(workdir)


# ---------------------------------------------------------------------------------------------
# the workdir lock


def test_a_live_run_holds_the_workdir_and_a_dead_one_does_not(tmp_path, no_model):
    w = tmp_path / "w"
    w.mkdir()
    (w / "metrics.jsonl").write_text('{"epoch": 1}\n')
    ckpt = checkpointing.Checkpointer(str(w))
    ckpt.save(1, {"w": np.ones((3,), np.float32)}, {"epoch": 1})
    ckpt.close()
    c = load_config_file("configs/demo.py", "smoke")
    holder = _hold_in_another_process(w)
    try:
        for resume in (True, False):  # --noresume must not delete under a live run either
            with pytest.raises(workdir_lock.WorkdirBusy) as e:
                runner.train(c, str(w), resume=resume)
            msg = str(e.value)
            assert "\n" not in msg and f"pid {holder.pid}" in msg, msg
            assert socket.gethostname() in msg, msg
            assert os.listdir(w / "checkpoints") == ["1"]
            assert (w / "metrics.jsonl").read_text() == '{"epoch": 1}\n'
            assert not (w / "config.json").exists()
    finally:
        holder.kill()
        holder.wait()
    # Control: the holder died without releasing anything (kill -9); the kernel dropped its
    # lock, so the next run gets past it to building the model.
    with pytest.raises(Built):
        runner.train(c, str(w))
    assert os.listdir(w / "checkpoints") == ["1"]


def test_the_lock_is_exclusive_within_one_process_and_released_on_exit(tmp_path):
    first = workdir_lock.WorkdirLock(str(tmp_path))
    with first:
        with pytest.raises(workdir_lock.WorkdirBusy, match=f"pid {os.getpid()}"):
            workdir_lock.WorkdirLock(str(tmp_path)).acquire()
        with pytest.raises(workdir_lock.WorkdirBusy):
            workdir_lock.check_free(str(tmp_path))
    assert not first.held
    workdir_lock.check_free(str(tmp_path))  # control: released
    with workdir_lock.WorkdirLock(str(tmp_path)) as again:
        assert again.held


def test_a_second_launcher_on_a_live_workdir_is_one_line(tmp_path):
    w = tmp_path / "w"
    w.mkdir()
    holder = _hold_in_another_process(w)
    try:
        out = subprocess.run(
            [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--config={SMOKE}",
             f"--workdir={w}", "--noprogress", "--noresume"],
            cwd=ROOT, env=ONE_DEVICE_ENV, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("error: workdir") and f"pid {holder.pid}" in lines[0], lines
    assert sorted(os.listdir(w)) == ["run.lock"]  # no train.log, no config.json


# ---------------------------------------------------------------------------------------------
# workdirs that cannot be used


def test_a_workdir_that_is_a_file_or_cannot_be_created_is_one_line(tmp_path, no_model):
    c = load_config_file("configs/demo.py", "smoke")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        runner.train(c, str(f))
    with pytest.raises(ValueError, match="cannot create --workdir"):
        runner.train(c, str(f / "sub"))
    with pytest.raises(Built):  # control: a directory that can be made gets through
        runner.train(c, str(tmp_path / "fine"))


def test_a_read_only_workdir_is_one_line(tmp_path, monkeypatch, no_model):
    c = load_config_file("configs/demo.py", "smoke")
    w = tmp_path / "ro"
    w.mkdir()
    real_open = open

    def read_only(path, *a, **k):  # root ignores chmod; a read-only mount answers EROFS
        if str(path).startswith(str(w)) and a and "w" in a[0]:
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, *a, **k)
    with monkeypatch.context() as m:
        m.setattr("builtins.open", read_only)
        with pytest.raises(ValueError, match="is not writable: Read-only file system"):
            runner.train(c, str(w))
    with pytest.raises(Built):  # control
        runner.train(c, str(w))


def test_the_launcher_names_a_file_workdir_in_one_line(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--config={SMOKE}",
         f"--workdir={f}", "--noprogress"],
        cwd=ROOT, env=ONE_DEVICE_ENV, capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and lines == [lines[0]], out.stderr[-3000:]
    assert "is a file, not a directory" in lines[0]


# ---------------------------------------------------------------------------------------------
# non-finite weights


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model = llama.Llama(llama.preset("tiny"), rngs=nnx.Rngs(0))
    checkpoint_hf.save_pretrained(model, str(d))
    tiny_tokenizer().save_pretrained(str(d))
    return d


def _poisoned(value):
    model = llama.Llama(llama.preset("tiny"), rngs=nnx.Rngs(0))
    spec = hf_layout.param_specs(model.config)[-1]
    var = spec.get(model)
    var.set_value(var.get_value().at[0, 0].set(value) if var.get_value().ndim == 2
                  else var.get_value().at[0].set(value))
    return model, spec.hf_name


@pytest.mark.parametrize("value", [jnp.nan, jnp.inf])
def test_non_finite_weights_are_refused_at_load_and_at_export(tiny_dir, tmp_path, value):
    loading.load(str(tiny_dir))  # control: the finite checkpoint loads
    model, name = _poisoned(value)
    with pytest.raises(ValueError) as e:
        checkpoint_hf.save_pretrained(model, str(tmp_path / "export"))
    assert "refusing to export" in str(e.value) and repr(name) in str(e.value), e.value
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")
    # A checkpoint written by another tool: the same bytes with the value injected.
    bad = tmp_path / "bad"
    import shutil

    from safetensors.numpy import load_file, save_file
    shutil.copytree(tiny_dir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors[name].reshape(-1)[0] = np.float32(value)
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError) as e:
        loading.load(str(bad))
    msg = str(e.value)
    assert "\n" not in msg and repr(name) in msg and str(bad) in msg, msg
    assert ("1 NaN" if np.isnan(value) else "1 inf") in msg, msg


# ---------------------------------------------------------------------------------------------
# export verification


def test_export_problem_names_what_is_missing(tiny_dir, tmp_path):
    import shutil
    assert checkpoint_hf.export_problem(str(tiny_dir)) is None  # control: complete
    for victim in ("tokenizer.json", "config.json", "model.safetensors"):
        d = tmp_path / victim
        shutil.copytree(tiny_dir, d)
        os.remove(d / victim)
        if victim == "tokenizer.json":  # AutoTokenizer would fall back to the slow files
            for f in os.listdir(d):
                if f.startswith(("vocab", "merges")):
                    os.remove(d / f)
        problem = checkpoint_hf.export_problem(str(d))
        assert problem is not None and str(d) in problem, (victim, problem)
    assert checkpoint_hf.export_problem(str(tmp_path / "absent")) is not None


def test_sigint_before_the_first_epoch_is_named(tmp_path, monkeypatch):
    c = load_config_file("configs/demo.py", "smoke")

    class Interrupted:
        def __init__(self, config, **kw):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises inside this sleep
            raise AssertionError("SIGINT did not stop the set-up")
    monkeypatch.setattr(run_lib, "build_run", Interrupted)
    # Python's default_int_handler, or SIG_IGN when pytest was started in the background by a
    # non-interactive shell: either way the runner's handler must give it back.
    before = signal.getsignal(signal.SIGINT)
    summary = runner.train(c, str(tmp_path / "w"))
    assert summary["stopped"] == "SIGINT" and summary["epochs"] is None
    assert signal.getsignal(signal.SIGINT) is before  # put back
    workdir_lock.check_free(str(tmp_path / "w"))  # and the lock released
