"""launch/study.py under faults: a second study on a live study directory, a study killed with
kill -9 (its runs must not train on as orphans), and a rerun beside a live run (its log must not
be truncated). No JAX training: stand-ins for train.py, and study.py stopped before it launches
one."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import ONE_DEVICE_ENV, ROOT, hold_lock_in_another_process, load_launcher

from jaxsocial.train import workdir_lock

STUDY = os.path.join(ROOT, "launch", "study.py")
SMOKE = "--config=configs/demo.py:smoke"


@pytest.fixture(scope="module")
def launcher():
    return load_launcher("launch/study.py")


def _snapshot(directory):
    """{relative path: bytes} of every file under directory."""
    out = {}
    for base, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


def _hold_study_lock(directory):
    """Another live process holding the study directory, as a running study does."""
    return hold_lock_in_another_process(directory, lock_name="study.lock", what="study")


def _study(workdir, *args):
    return subprocess.run([sys.executable, STUDY, SMOKE, "--seeds=1", f"--workdir={workdir}",
                           *args], cwd=ROOT, env=ONE_DEVICE_ENV, capture_output=True,
                          text=True, timeout=300)


# ---------------------------------------------------------------------------------------------
# one study per directory


def test_a_second_study_on_a_live_directory_is_one_line_and_touches_nothing(tmp_path):
    w = tmp_path / "study"
    (w / "trained-seed0").mkdir(parents=True)
    (w / "trained-seed0.log").write_bytes(b"epoch 3 of the first study's live run\n")
    holder = _hold_study_lock(w)
    try:
        # The first study's run is live too (so a study that ignored study.lock would stop at
        # it rather than train).
        with workdir_lock.WorkdirLock(str(w / "trained-seed0")):
            before = _snapshot(w)
            p = _study(w)
            after = _snapshot(w)
    finally:
        holder.kill()
        holder.wait()
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and p.stdout == "", p.stdout[-2000:] + p.stderr[-2000:]
    assert len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith(f"error: workdir {w} is in use by pid {holder.pid} on host "
                               f"{socket.gethostname()} (started "), lines[0]
    assert "wait for that study to end" in lines[0]
    assert after == before  # the live log byte for byte, the holder's lock file, nothing new


def test_a_dead_studys_lock_file_does_not_block_and_a_live_runs_log_is_left_alone(tmp_path):
    """Control of the refusal above: the holder died (kill -9), its study.lock stays behind,
    and the next study gets past it. Its one run's workdir is held by a live train.py (here:
    this process), so that run is reported busy, naming the holder, and not started; its log is
    byte-identical afterwards; the study exits 1 without a table."""
    w = tmp_path / "study"
    run_dir = w / "trained-seed0"
    run_dir.mkdir(parents=True)
    live_log = b"epoch 3 of a live run\n(no newline at the end"
    (w / "trained-seed0.log").write_bytes(live_log)
    holder = _hold_study_lock(w)
    holder.kill()
    holder.wait()
    assert (w / "study.lock").exists()
    with workdir_lock.WorkdirLock(str(run_dir)):
        p = _study(w)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert (w / "trained-seed0.log").read_bytes() == live_log
    busy = [line for line in p.stdout.splitlines() if line.startswith("busy trained-seed0:")]
    assert len(busy) == 1 and f"is in use by pid {os.getpid()} on host" in busy[0], out[-3000:]
    assert f"failed: trained-seed0 (not started: workdir {run_dir} is in use by pid " \
           f"{os.getpid()}" in p.stdout, out[-3000:]
    assert "start trained-seed0" not in p.stdout and "error:" not in p.stderr
    assert not (w / "study.md").exists() and not (w / "study.json").exists()
    assert sorted(os.listdir(run_dir)) == ["run.lock"]


# ---------------------------------------------------------------------------------------------
# a rerun beside a live run: the launcher's log handling

FAKE_TRAIN = """
import sys
print("fake train " + [a for a in sys.argv if a.startswith("--workdir=")][0], flush=True)
"""


def _quiet():
    lines = []
    return lines, type("Out", (), {"write": lambda self, t: lines.append(t),
                                   "flush": lambda self: 0})()


def test_a_busy_run_is_not_started_and_a_log_is_appended_to(launcher, tmp_path, monkeypatch):
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_TRAIN)
    monkeypatch.setattr(launcher, "TRAIN", str(fake))
    from ml_collections import ConfigDict
    cfg = ConfigDict({"train": {"epochs": 1}})
    runs = [launcher.Run(arm, 0, str(tmp_path / f"{arm}-seed0"),
                         [f"--workdir={tmp_path / f'{arm}-seed0'}"], cfg) for arm in "ab"]
    live, old = b"a live run's console\n", b"an earlier attempt\nerror: old failure\n"
    (tmp_path / "a-seed0.log").write_bytes(live)
    (tmp_path / "b-seed0.log").write_bytes(old)
    os.makedirs(runs[0].workdir)
    lines, out = _quiet()
    with workdir_lock.WorkdirLock(runs[0].workdir):  # a train.py on a-seed0, alive
        worker = launcher.Launcher(parallel=2, out=out)
        rcs = worker.run(runs)
    assert rcs == {"b-seed0": 0}  # a-seed0 was never started
    assert list(worker.busy) == ["a-seed0"] and f"pid {os.getpid()}" in worker.busy["a-seed0"]
    assert (tmp_path / "a-seed0.log").read_bytes() == live
    said = "".join(lines)
    assert "busy a-seed0: workdir " in said and "start a-seed0" not in said
    b_log = (tmp_path / "b-seed0.log").read_text()
    assert b_log.startswith(old.decode())  # appended: the earlier attempt stays
    header = b_log[len(old):].splitlines()[0]
    assert header.startswith("=== start ") and f"(launch/study.py pid {os.getpid()}) ===" \
        in header, b_log
    assert f"fake train --workdir={runs[1].workdir}" in b_log
    # The error line of the earlier attempt is not this attempt's.
    assert launcher.last_error(runs[1].log) == ""
    reported = []
    assert launcher.report_problems(runs, rcs, reported.append, worker.busy) == 2
    assert reported[0].startswith(f"failed: a-seed0 (not started: workdir {runs[0].workdir} "
                                  f"is in use by pid {os.getpid()}")
    # Control: with a-seed0's lock released, the same launcher call starts it, and its log
    # (appended to) keeps what was there.
    lines, out = _quiet()
    worker = launcher.Launcher(parallel=2, out=out)
    assert worker.run(runs[:1]) == {"a-seed0": 0} and worker.busy == {}
    a_log = (tmp_path / "a-seed0.log").read_bytes()
    assert a_log.startswith(live) and b"=== start " in a_log and b"fake train" in a_log


def test_last_error_is_the_last_attempts(launcher, tmp_path):
    log = tmp_path / "r.log"
    log.write_text("error: first\n=== start x ===\nerror: second\nerror: third\n")
    assert launcher.last_error(str(log)) == "error: third"
    log.write_text("error: first\n=== start x ===\nall fine\n")
    assert launcher.last_error(str(log)) == ""
    log.write_text("error: first\nall fine\n")  # control: no header, the whole log counts
    assert launcher.last_error(str(log)) == "error: first"


# ---------------------------------------------------------------------------------------------
# the runs die with their study

# A stand-in for train.py: records its pid and session, then on SIGTERM records the signal and
# exits (train.py checkpoints and exits 0 there).
GRANDCHILD = """
import os, signal, sys, time
marker = sys.argv[1]
def stop(signum, frame):
    with open(marker + ".signal", "w") as f:
        f.write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
with open(marker + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {os.getsid(0)}")
os.replace(marker + ".tmp", marker + ".ready")
time.sleep(60)
"""

# A stand-in for study.py: starts GRANDCHILD through launch/study.py's spawn, prints its pid,
# waits to be killed.
PARENT = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("study_launcher", sys.argv[1])
study = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study)
marker, parent_death = sys.argv[2], sys.argv[3] == "1"
with open(marker + ".log", "a") as log:
    proc = study.spawn([sys.executable, "-c", sys.argv[4], marker], log,
                       parent_death=parent_death)
print(proc.pid, flush=True)
time.sleep(120)
"""


def _alive(pid):
    """The process exists and is not a zombie (whoever adopted it may not have reaped it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _kill9_parent(tmp_path, parent_death):
    """(the grandchild's pid, its session id, the signal it recorded or None, alive 3 s after
    its parent's kill -9)."""
    marker = str(tmp_path / f"child-{int(parent_death)}")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, STUDY, marker,
                               "1" if parent_death else "0", GRANDCHILD], cwd=ROOT,
                              env=ONE_DEVICE_ENV, stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(parent.stdout.readline())
        assert _wait_for(lambda: os.path.exists(marker + ".ready"), 30), \
            open(marker + ".log").read()
        child_pid, sid = map(int, open(marker + ".ready").read().split())
        assert child_pid == pid  # the pid study.py signals is the command's own
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        died = _wait_for(lambda: not _alive(pid), 5 if parent_death else 3)
        got = open(marker + ".signal").read() if os.path.exists(marker + ".signal") else None
        return pid, sid, got, not died
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_kill9_of_the_study_sends_its_runs_sigterm(launcher, tmp_path):
    assert launcher.PARENT_DEATH
    pid, sid, got, alive = _kill9_parent(tmp_path, parent_death=True)
    assert not alive and got == "SIGTERM"
    assert sid == pid  # still a session of its own: a terminal's Ctrl-C reaches it once


def test_without_the_parent_death_signal_the_run_is_orphaned(tmp_path):
    """Control: the same without PR_SET_PDEATHSIG (what study.py did before, and still does off
    Linux) leaves the run alive after its parent's kill -9."""
    pid, sid, got, alive = _kill9_parent(tmp_path, parent_death=False)
    assert alive and got is None and sid == pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_whose_study_died_before_the_prctl_does_not_start(launcher, tmp_path):
    """The race: the study died between the fork and the prctl, so no signal will come; the
    step before exec sees that its parent is no longer the study and does not start the run."""
    target = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(target)!r}, 'w').close()"]
    wrapper = [sys.executable, "-c", launcher._PARENT_DEATH_EXEC]
    gone = subprocess.run([*wrapper, str(os.getppid()), *command], capture_output=True,
                          text=True, timeout=60)
    assert gone.returncode == 1 and not target.exists()
    assert gone.stderr.strip() == (f"error: launch/study.py (pid {os.getppid()}) ended before "
                                   f"this run began: not started")
    # Control: its parent is the one it was given: the command runs.
    ok = subprocess.run([*wrapper, str(os.getpid()), *command], capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0 and ok.stderr == "" and target.exists()
