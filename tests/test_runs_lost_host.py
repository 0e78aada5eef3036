"""A lost host is one line: when a process of a multi-process run dies, the others exit 1 with
one `error:` line naming it and the checkpoint to resume from (jaxsocial.train.peers), within
the heartbeat timeout. Rerunning every process's command resumes: the resume comparison leaves
the process ids out (tested below without starting processes)."""
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

from jaxsocial.train import peers

# The client's fatal message as jaxlib 0.10 logs it before abort() (a survivor's train.log).
FATAL = (
    "E1207 02:25:45.507370 4685 coordination_service_agent.cc:289] Polled an error from "
    "coordination service (this can be an error from this or another task).\n"
    "F1207 02:25:45.507611 4685 client.h:80] Terminating process because the JAX distributed "
    "service detected fatal errors. This most likely indicates that another task died; see the "
    "other task logs for more details. Disable Python buffering, i.e. `python -u`, to be sure "
    "to see all the previous output. absl::Status: UNAVAILABLE: The following tasks are "
    "unhealthy (stopped sending heartbeats):\n{tasks}\nThe tasks have crashed. Check the task "
    "logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug "
    "further.\n\nRPC: /xla.coordination.CoordinationService/PollForError\n"
    "*** Check failure stack trace: ***\n")
LEADER_LOST = (
    "F1207 02:28:23.162 10494 client.h:80] Terminating process because the JAX distributed "
    "service detected fatal errors. This most likely indicates that another task died. "
    "absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader "
    "task was preempted/died/restarted unexpectedly or this task is experiencing network "
    "issues.\n")


def test_the_line_names_the_lost_process_and_the_newest_checkpoint(tmp_path):
    for step in ("1", "2", "3.orbax-checkpoint-tmp"):  # 3: a save the loss interrupted
        (tmp_path / "checkpoints" / step).mkdir(parents=True)
    wd = str(tmp_path)
    line = peers.lost_host_line("I... epoch 2\n" + FATAL.format(tasks="1"), wd, 0, 2,
                                where=" (full log: x/train.log)")
    assert line.startswith("error: lost process 1 of 2: no heartbeat reached the coordination "
                           f"service for {peers.heartbeat_timeout_s()} s (killed, crashed, "
                           f"failed or its host went down; its log: {wd}/train.1.log)"), line
    assert ("process 0 stops too; resume from checkpoint 2 by rerunning the same commands on "
            "every process (full log: x/train.log)") in line, line
    assert "\n" not in line
    # Older jaxlibs name tasks in full; several lost at once; this process among them.
    line = peers.lost_host_line(FATAL.format(
        tasks="/job:jax_worker/replica:0/task:3\n/job:jax_worker/replica:0/task:1"), wd, 0, 4)
    assert line.startswith("error: lost process 3, 1 of 4:"), line
    line = peers.lost_host_line(FATAL.format(tasks="2\n0"), wd, 0, 3, resume=False)
    assert line.startswith("error: lost process 2 of 3:"), line
    assert "rerunning the same commands without --noresume" in line, line
    line = peers.lost_host_line(FATAL.format(tasks="1"), wd, 1, 2)
    assert "took this process (1 of 2) for dead" in line, line
    # Process 0, the coordination service's host, lost: the others learn it at once.
    line = peers.lost_host_line(LEADER_LOST, wd, 1, 2)
    assert line.startswith("error: lost process 0 of 2, the coordination service's host"), line
    # Another fatal error of the service: named by its status, still one line.
    line = peers.lost_host_line(FATAL[:FATAL.index("UNAVAILABLE")] + "ABORTED: task 1 tried "
                                "to connect with a different incarnation.\nmore", wd, 0, 2)
    assert line.startswith("error: the coordination service stopped the run: ABORTED: task 1 "
                           "tried to connect with a different incarnation."), line
    # No checkpoint yet: rerunning starts over.
    line = peers.lost_host_line(FATAL.format(tasks="1"), str(tmp_path / "new"), 0, 2)
    assert ("no checkpoint was saved yet: rerunning the same commands on every process starts "
            "over") in line, line
    # Negative controls: a log without the service's verdict (a healthy run's, or another
    # abort's) gives no line, so the handler lets that abort go on as before.
    assert peers.lost_host_line("I... epoch 2\nF... check failed: x == y\n", wd, 0, 2) is None
    assert peers.lost_host_line("", wd, 0, 2) is None
    assert peers.checkpoint_steps(wd) == [1, 2]


def test_a_failed_collective_waits_for_the_verdict():
    gone = ValueError("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/"
                      "pair.cc:538] Read error [127.0.0.1]:33981: Connection reset by peer")
    assert peers.lost_peer_error(gone)
    assert not peers.lost_peer_error(ValueError("cannot resume runs/x: config changed"))
    assert not peers.lost_peer_error(FileNotFoundError("no checkpoint under runs/x"))


def test_each_process_resumes_with_its_own_process_id():
    """config.json holds process 0's distributed.* keys; the others' differ by design, so the
    resume comparison leaves distributed.* out (the same commands resume every process)."""
    from jaxsocial.train import config as run_config
    stored = run_config.base_config()
    stored.distributed.update(enabled=True, coordinator_address="10.0.0.1:1234",
                              num_processes=2, process_id=0)
    new = run_config.base_config()
    new.distributed.update(enabled=True, coordinator_address="10.0.0.1:4321",
                           num_processes=2, process_id=1)
    assert run_config.resume_differences(run_config.as_plain(stored), new) == ({}, {})
    new.train.epochs = 9  # negative control: other keys are still compared
    assert run_config.resume_differences(run_config.as_plain(stored), new) == (
        {"train.epochs": (stored.train.epochs, 9)}, {})


ABORTS = r"""
import os, sys
from jaxsocial.train import peers
workdir, log, fatal = sys.argv[1], sys.argv[2], sys.argv[3]
console = os.fdopen(os.dup(2), "w", buffering=1)  # as launch/train.py: fd 2 -> the log
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(fd, 2)
assert peers.install(console, workdir, log, 0, 2, where=" (full log: " + log + ")")
os.write(2, (fatal + "\n").encode())  # what JAX's client logs before abort()
os.abort()
"""


def _errors(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("verdict", [True, False])
def test_the_abort_becomes_the_line_and_exit_status_1(tmp_path, verdict):
    """The SIGABRT handler in a real process: JAX's fatal message in the log, then abort()
    gives one console line and exit status 1; any other abort stays an abort (negative
    control), its tracebacks in the log."""
    (tmp_path / "checkpoints" / "4").mkdir(parents=True)
    log = tmp_path / "train.log"
    fatal = FATAL.format(tasks="1") if verdict else "F... check failed: x == y"
    p = subprocess.run([sys.executable, "-c", ABORTS, str(tmp_path), str(log), fatal],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    if verdict:
        assert p.returncode == 1, (p.stderr, log.read_text())
        assert _errors(p.stderr) == [peers.lost_host_line(
            fatal, str(tmp_path), 0, 2, where=f" (full log: {log})")], p.stderr
        assert "resume from checkpoint 4 " in p.stderr
        assert "on the console: error: lost process 1 of 2" in log.read_text()
    else:
        assert p.returncode == -signal.SIGABRT, (p.returncode, p.stderr)
        assert _errors(p.stderr) == [], p.stderr
        assert "Current thread" in log.read_text()  # the tracebacks, as faulthandler's


# The end-to-end case (two launched processes, one killed during epoch 2: one line within the
# heartbeat timeout) shares its launch with the two-process agreement test:
# tests/test_train_loop.py::test_two_processes_agree_with_one_and_a_lost_one_is_one_line.
