"""Trustworthy runs: resume refuses a changed config, checkpoints are
verified with a fallback to the newest good one, and every epoch is logged exactly once."""
import importlib.util
import json
import logging
import os
import shutil
import struct

import jax
import numpy as np
import pytest

from jaxsocial.train import checkpointing, runner, sharding
from jaxsocial.train import config as run_config
from jaxsocial.train import run as run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(arg="smoke"):
    spec = importlib.util.spec_from_file_location("demo_cfg", os.path.join(ROOT, "configs",
                                                                          "demo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config(arg)
    c.train.epochs = 4
    c.train.checkpoint_every = 2
    c.train.export_hf = False
    c.train.log_samples = 2
    return c


def epochs_of(path):
    return [json.loads(line)["epoch"] for line in open(path) if line.strip()]


def tb_steps(workdir):
    """(tag, step) of every scalar in the workdir's TensorBoard event files."""
    from tensorboardX.proto import event_pb2
    out = []
    tb = os.path.join(workdir, "tensorboard")
    for name in sorted(os.listdir(tb)) if os.path.isdir(tb) else ():
        data = open(os.path.join(tb, name), "rb").read()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event()
            ev.ParseFromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            out += [(v.tag, ev.step) for v in ev.summary.value]
    return sorted(out, key=lambda t: t[1])  # the files' order is not the steps' order


@pytest.fixture(scope="module")
def smoke():
    # One device: these tests are about files, not sharding, and an epoch over the 8 fake
    # devices of the suite costs ~10x one on a single device on 2 cores.
    c = load_config()
    return c, run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))


@pytest.fixture(scope="module")
def full(smoke, tmp_path_factory):
    """An uninterrupted 4-epoch run (checkpoints 2 and 4)."""
    config, run = smoke
    w = tmp_path_factory.mktemp("full")
    summary = runner.train(config, str(w), run=run)
    assert summary["epochs"] == 4
    return w, jax.device_get(_final_params(config, run, w))


def _final_params(config, run, w):
    ck = checkpointing.Checkpointer(str(w))
    tree, _, step = ck.restore(run.init_state())
    ck.close()
    return tree.train.params


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# 1. resume compares configs


def test_resume_refuses_a_shape_changing_key_and_keeps_config_json(smoke, full, tmp_path):
    config, _ = smoke
    w = _copy(full[0], tmp_path / "w")
    before = (w / "config.json").read_text()
    for key, value in (("agents.num_agents", 2), ("model.preset", "small_20m")):
        c = load_config()
        c.train.epochs = 10
        section, name = key.split(".")
        c[section][name] = value
        with pytest.raises(ValueError) as e:
            runner.train(c, str(w))  # refused before any model is built
        msg = str(e.value)
        assert "\n" not in msg and key in msg and "new --workdir" in msg, msg
        assert "train.epochs" not in msg.split("these change")[0], msg  # only unsafe keys named
        assert (w / "config.json").read_text() == before
    # Control: the same config resumes (nothing to do, already at epoch 4) and says so,
    # leaving the logs as they were: no new TensorBoard file, no new records.
    tb_before = sorted(os.listdir(w / "tensorboard"))
    metrics_before = (w / "metrics.jsonl").read_text()
    again = runner.train(load_config(), str(w), run=smoke[1])
    assert again["epochs"] == 4 and again["already_finished"]
    assert (w / "metrics.jsonl").read_text() == metrics_before
    assert len(os.listdir(w / "tensorboard")) == len(tb_before)
    assert [s for tag, s in tb_steps(w) if tag == "avg_likes_per_post"] == [1, 2, 3, 4]


def test_safe_change_needs_the_flag_and_is_recorded(smoke, full, tmp_path):
    _, run = smoke
    w = _copy(full[0], tmp_path / "w")
    c = load_config()
    c.train.epochs = 5
    with pytest.raises(ValueError, match="allow_config_change=True") as e:
        runner.train(c, str(w), run=run)
    assert "train.epochs (4 -> 5)" in str(e.value)
    assert json.loads((w / "config.json").read_text())["train"]["epochs"] == 4
    c.train.allow_config_change = True
    summary = runner.train(c, str(w), run=run)
    assert summary["epochs"] == 5
    changes = [json.loads(line) for line in open(w / "config_changes.jsonl")]
    assert changes == [dict(changes[0], changes={"train.epochs": [4, 5]}, resumed_epoch=4)]
    assert json.loads((w / "config.json").read_text())["train"]["epochs"] == 5
    assert epochs_of(w / "metrics.jsonl") == [1, 2, 3, 4, 5]


def test_safe_keys_are_an_explicit_short_list():
    c = load_config()
    stored = run_config.as_plain(c)
    c2 = load_config()
    c2.train.epochs, c2.train.keep_checkpoints = 9, 5
    c2.reward.like, c2.society.feed_size, c2.seed = 0.5, 2, 7
    safe, unsafe = run_config.resume_differences(stored, c2)
    assert set(safe) == {"train.epochs", "train.keep_checkpoints"}
    assert set(unsafe) == {"reward.like", "society.feed_size", "seed"}


# ---------------------------------------------------------------------------------------------
# 2. verified checkpoints with fallback


def _data_file(step_dir):
    files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir / "state") for f in fs
             if os.path.basename(d) == "d"]  # OCDBT data files
    return max(files, key=os.path.getsize)


def _bitflip(step_dir):
    p = _data_file(step_dir)
    b = bytearray(open(p, "rb").read())
    for i in range(len(b) // 2, len(b) // 2 + 64):
        b[i] ^= 0xFF
    open(p, "wb").write(bytes(b))


def _truncate(step_dir):
    p = _data_file(step_dir)
    os.truncate(p, os.path.getsize(p) // 2)


def _drop_metadata(step_dir):
    os.remove(step_dir / "state" / "_METADATA")


@pytest.mark.parametrize("corrupt", [
    _bitflip, _truncate, _drop_metadata])
def test_corrupt_latest_checkpoint_falls_back_and_says_so(smoke, full, tmp_path, corrupt, caplog):
    config, run = smoke
    w = _copy(full[0], tmp_path / "w")
    corrupt(w / "checkpoints" / "4")
    with caplog.at_level(logging.WARNING):
        summary = runner.train(config, str(w), run=run)
    warned = [r.getMessage() for r in caplog.records
              if "checkpoints/4 is" in r.getMessage() and "falling back" in r.getMessage()]
    assert len(warned) == 1, caplog.text[-2000:]
    # One clean line: TensorStore's own reason, not orbax's wrapper with a pybind repr.
    assert "\n" not in warned[0] and "bound method" not in warned[0] \
        and "TensorStore details" not in warned[0], warned[0]
    if corrupt is _truncate:
        assert "OUT_OF_RANGE" in warned[0] and "byte range" in warned[0], warned[0]
    assert (w / "checkpoints_corrupt" / "4").is_dir()
    assert summary["epochs"] == 4
    assert epochs_of(w / "metrics.jsonl") == [1, 2, 3, 4]
    # Retrained from checkpoint 2: the same weights as the uninterrupted run (CPU: bit exact).
    got = jax.device_get(_final_params(config, run, w))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(full[1])):
        np.testing.assert_array_equal(a, b)


def test_no_good_checkpoint_is_an_error_not_a_fresh_start(smoke, full, tmp_path):
    config, run = smoke
    w = _copy(full[0], tmp_path / "w")
    for step in ("2", "4"):
        _truncate(w / "checkpoints" / step)
    with pytest.raises(ValueError, match="no good checkpoint") as e:
        runner.train(config, str(w), run=run)
    assert "checkpoints/4" in str(e.value) and "checkpoints/2" in str(e.value)


def test_checksums_catch_one_flipped_bit():
    tree = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "k": np.arange(2, dtype=np.uint32),
            "b": np.array([True, False])}
    sums = json.loads(json.dumps(checkpointing.tree_checksums(tree)))
    assert checkpointing.checksum_mismatches(tree, sums) == []  # control
    bad = dict(tree, w=tree["w"].copy())
    bad["w"].view(np.uint32)[1, 2] ^= 1 << 7
    assert checkpointing.checksum_mismatches(bad, sums) == ["['w']"]
    swapped = dict(tree, w=tree["w"].reshape(-1)[::-1].reshape(3, 4).copy())  # same sum, moved
    assert checkpointing.checksum_mismatches(swapped, sums) == ["['w']"]



def _numpy_checksum(x):
    """The checksum's definition on the whole leaf at once (uint32 arithmetic wraps)."""
    u = np.ascontiguousarray(x).view(np.uint32).reshape(-1)
    pos = np.arange(u.size, dtype=np.uint32) * np.uint32(2654435761) + np.uint32(1)
    return [int(u.sum(dtype=np.uint32)), int((u * pos).sum(dtype=np.uint32))]


def test_checksums_are_summed_a_chunk_at_a_time_as_over_the_whole_leaf():
    """A leaf of eight chunks and a remainder gets the whole-leaf sums (checkpoints written
    before the chunking verify), and its program's temporaries stay a chunk's, not the leaf's
    (whole, XLA held the leaf's bits and positions: twice its size)."""
    n = 8 * checkpointing._CHUNK + 3
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    got = checkpointing.tree_checksums({"x": x})["['x']"]
    assert got[:2] == _numpy_checksum(x) and got[2:] == [[n], "float32"]
    wrong = _numpy_checksum(np.concatenate([x[:-3], np.zeros(3, np.float32)]))
    assert got[:2] != wrong  # control: the remainder counts
    temp = checkpointing._leaf_checksum.lower(x).compile().memory_analysis().temp_size_in_bytes
    assert temp < x.nbytes / 2, temp

# ---------------------------------------------------------------------------------------------
# 3. exactly-once logs


def _expect_once(w, n):
    assert epochs_of(w / "metrics.jsonl") == list(range(1, n + 1))
    samples = epochs_of(w / "samples.jsonl")
    assert sorted(set(samples)) == list(range(1, n + 1)) and len(samples) == 2 * n
    steps = [s for tag, s in tb_steps(w) if tag == "avg_likes_per_post"]
    assert steps == list(range(1, n + 1)), steps


def test_rebuilt_events_survive_a_writer_opened_in_the_same_second(tmp_path):
    from jaxsocial.train import run_log as log_lib
    with log_lib.MetricWriter(str(tmp_path)) as mw:
        for e in (1, 2, 3):
            mw.write(e, {"epoch": e, "avg_likes_per_post": float(e)})
    assert log_lib.cut_logs(str(tmp_path), 2) == 2
    with log_lib.MetricWriter(str(tmp_path)) as mw:  # same second: the file names collided
        mw.write(3, {"epoch": 3, "avg_likes_per_post": 3.0})
    assert [s for tag, s in tb_steps(tmp_path) if tag == "avg_likes_per_post"] == [1, 2, 3]
    assert epochs_of(tmp_path / "metrics.jsonl") == [1, 2, 3]


def test_killed_after_first_metrics_before_first_checkpoint(smoke, tmp_path, monkeypatch):
    config, run = smoke
    w = tmp_path / "w"
    real = run.run_epoch
    calls = []

    def dies_in_epoch_2(state):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real(state)
    # (a Run is frozen: the stand-in goes on its class, and monkeypatch puts the method back)
    monkeypatch.setattr(type(run), "run_epoch", lambda self, state: dies_in_epoch_2(state))
    with pytest.raises(KeyboardInterrupt):
        runner.train(config, str(w), run=run)
    monkeypatch.undo()
    assert epochs_of(w / "metrics.jsonl") == [1] and not os.listdir(w / "checkpoints")
    logged = (w / "metrics.jsonl").read_bytes()
    # Nothing to resume from: refused in one line, the logged epoch kept (no silent restart)...
    with pytest.raises(ValueError, match="no checkpoint to resume from.*--noresume"):
        runner.train(config, str(w), run=run)
    assert (w / "metrics.jsonl").read_bytes() == logged
    # ...and --noresume starts over.
    runner.train(config, str(w), run=run, resume=False)
    _expect_once(w, 4)


def test_killed_during_the_first_save(smoke, tmp_path, monkeypatch):
    config, run = smoke
    w = tmp_path / "w"

    def killed(self, step, tree, meta):
        # What kill -9 leaves: orbax's unfinished temporary directory.
        os.makedirs(os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp-1", "state"))
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(checkpointing.Checkpointer, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        runner.train(config, str(w), run=run)
    monkeypatch.undo()
    assert epochs_of(w / "metrics.jsonl") == [1, 2]
    with pytest.raises(ValueError, match="holds 2 epoch.*no checkpoint"):  # nothing to resume
        runner.train(config, str(w), run=run)
    runner.train(config, str(w), run=run, resume=False)
    _expect_once(w, 4)


def test_resume_cuts_logs_and_drops_a_torn_line(smoke, full, tmp_path, caplog):
    config, run = smoke
    w = _copy(full[0], tmp_path / "w")
    shutil.rmtree(w / "checkpoints" / "4")   # resume from 2: epochs 3, 4 are redone
    with open(w / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 9, "avg')
    with caplog.at_level(logging.WARNING):
        runner.train(config, str(w), run=run)
    assert any("metrics.jsonl" in r.getMessage() and "unreadable line" in r.getMessage()
               for r in caplog.records), caplog.text[-2000:]
    _expect_once(w, 4)


def test_fresh_start_over_leftovers_starts_the_logs_over(smoke, full, tmp_path):
    config, run = smoke
    w = _copy(full[0], tmp_path / "w")
    shutil.rmtree(w / "checkpoints")
    c = load_config()
    c.train.epochs = 2
    with pytest.raises(ValueError, match="holds 4 epoch"):
        runner.train(c, str(w), run=run)
    assert epochs_of(w / "metrics.jsonl") == [1, 2, 3, 4]
    runner.train(c, str(w), run=run, resume=False)
    _expect_once(w, 2)


def test_a_summary_without_metrics_or_checkpoints_is_no_fresh_start(tmp_path):
    # Refused before anything is built (no run given, none needed); a control: an empty
    # workdir is a fresh start, which gets as far as building the run.
    w = tmp_path / "w"
    w.mkdir()
    (w / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="holds a summary.json but no checkpoint"):
        runner.train(load_config(), str(w))
    (w / "summary.json").unlink()

    class Built(Exception):
        pass

    def build(config, **kw):
        raise Built()
    import unittest.mock
    with unittest.mock.patch.object(run_lib, "build_run", build), pytest.raises(Built):
        runner.train(load_config(), str(w))


# ---------------------------------------------------------------------------------------------
# outputs that are all or nothing, and SIGINT


def test_a_finished_run_writes_or_repairs_its_export_whole(smoke, full, tmp_path, monkeypatch):
    from jaxsocial.models import checkpoint_hf
    _, run = smoke
    w = _copy(full[0], tmp_path / "w")
    c = load_config()
    c.train.export_hf = True
    c.train.allow_config_change = True
    first = runner.train(c, str(w), run=run)  # finished without exports: both written
    assert first["already_finished"] and first["repaired"] == ["export", "initial"]
    for name in ("export", "initial"):
        assert checkpoint_hf.export_problem(str(w / name)) is None
    initial_mtime = os.path.getmtime(w / "initial" / "model.safetensors")

    # An export that lost its tokenizer (a kill -9 mid-write, or a deleted file)...
    os.remove(w / "export" / "tokenizer.json")
    assert checkpoint_hf.export_problem(str(w / "export")) is not None
    # ...and a rerun killed while writing it again: the half-written copy never takes its place.
    real_export = type(run).export_policy

    def dies_mid_write(self, state, path, write=True, initial=False):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "config.json"), "w").write("{")
        raise OSError("killed mid-write")
    monkeypatch.setattr(type(run), "export_policy", dies_mid_write)
    with pytest.raises(OSError, match="killed mid-write"):
        runner.train(load_config_export(), str(w), run=run)
    assert json.loads((w / "export" / "config.json").read_text())  # not the half-written "{"
    monkeypatch.setattr(type(run), "export_policy", real_export)

    again = runner.train(load_config_export(), str(w), run=run)
    assert again["repaired"] == ["export"], again.get("repaired")
    assert checkpoint_hf.export_problem(str(w / "export")) is None
    assert os.path.getmtime(w / "initial" / "model.safetensors") == initial_mtime
    assert not any(n.endswith((".partial", ".old")) for n in os.listdir(w))
    # Control: a whole export is left alone.
    assert "repaired" not in runner.train(load_config_export(), str(w), run=run)
    assert json.loads((w / "summary.json").read_text())["already_finished"]


def load_config_export():
    c = load_config()
    c.train.export_hf = True
    return c


@pytest.mark.parametrize("signal_during_save", [True, False])
def test_a_stop_signal_during_a_save_stops_right_after_it(smoke, tmp_path, monkeypatch,
                                                          signal_during_save):
    import signal
    _, run = smoke
    c = load_config()
    c.train.epochs = 2
    c.train.checkpoint_every = 1
    real_save = checkpointing.Checkpointer.save

    def save(self, step, tree, meta):
        if signal_during_save and step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # while checkpoint 1 is being written
        real_save(self, step, tree, meta)
    monkeypatch.setattr(checkpointing.Checkpointer, "save", save)
    summary = runner.train(c, str(tmp_path / "w"), run=run)
    ck = checkpointing.Checkpointer(str(tmp_path / "w"))
    steps = ck.all_steps()
    ck.close()
    if signal_during_save:  # stopped after epoch 1's save, not after epoch 2
        assert summary.get("stopped") == "SIGTERM" and summary["epochs"] == 1, summary
        assert steps == [1] and epochs_of(tmp_path / "w" / "metrics.jsonl") == [1]
    else:  # control: without the signal the same run goes on to epoch 2
        assert "stopped" not in summary and summary["epochs"] == 2
        assert steps == [1, 2]


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_mid_run_checkpoints_the_epoch(smoke, tmp_path, monkeypatch, name):
    import signal
    _, run = smoke
    real_epoch = run.run_epoch

    def interrupted(state):
        out = real_epoch(state)
        os.kill(os.getpid(), getattr(signal, name))  # Ctrl-C / kill while the epoch runs
        return out
    monkeypatch.setattr(type(run), "run_epoch", lambda self, state: interrupted(state))
    summary = runner.train(load_config(), str(tmp_path / "w"), run=run)
    assert summary["stopped"] == name and summary["epochs"] == 1
    ck = checkpointing.Checkpointer(str(tmp_path / "w"))
    assert ck.all_steps() == [1]  # checkpoint_every=2: saved because of the signal
    ck.close()
    assert epochs_of(tmp_path / "w" / "metrics.jsonl") == [1]
