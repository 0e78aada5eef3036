r"""Social-RL training: agents act in the society, likes become reward, PPO/GRPO updates them.

    python launch/train.py --config=configs/demo.py --workdir=runs/demo
    python launch/train.py --config=configs/general.py --config.model.checkpoint=/path/llama3-8b
    python launch/train.py --config=configs/demo.py --config.rl.learning_rate=1e-4 \
        --config.train.epochs=3

The workdir receives metrics.jsonl (one object per epoch), TensorBoard events, samples.jsonl,
orbax checkpoints (every `train.checkpoint_every` epochs and at the end; the last
`train.keep_checkpoints` kept), summary.json, train.log (the full log) and the final policy as a
Hugging Face directory (export/, tokenizer included) with the initial policy beside it
(initial/, launch/eval.py's default baseline). Re-running with the same workdir resumes from
its newest good checkpoint (the resumed run produces the same metrics as an uninterrupted
one) if the config matches the stored config.json; `--config.train.allow_config_change=True`
accepts changed train.* keys (more epochs, ...); `--noresume` starts over. A workdir that holds
logged epochs but no checkpoint cannot resume and is refused (`--noresume` starts over there).
SIGTERM and SIGINT (Ctrl-C) exit 0: during the epoch loop after saving a checkpoint at the end
of the current epoch (right after the save when the signal arrives during one), before it at
once. A run refused before its first epoch (a bad fork, a config the set-up rejects) leaves no
file behind: a workdir this launch made is removed again, its train.log included. One run per
workdir: a second run on a live workdir is refused in one line naming the holder's pid and host
(`workdir/run.lock`). export/ and initial/ appear whole
or not at all; rerunning a finished run rewrites either one if it is missing or incomplete.

The console shows a progress bar with each epoch's headline metrics, warnings of this project
and one-line errors; everything else (absl/orbax/XLA logs, tracebacks) goes to
workdir/train.log. `--verbose` sends everything to the console instead.

Multi-process runs (`--config.distributed.enabled=True`, the same command on every host with
its own `process_id`; process p > 0 logs to train.p.log): when a process dies (kill -9, a
crash, a host going down), the others stop with exit status 1 and one line naming the lost
process and the checkpoint to resume from ("error: lost process 1 of 2: ...; resume from
checkpoint 3 by rerunning the same commands on every process"), within the heartbeat timeout
(`--heartbeat_timeout`, 30 s: the coordination service declares a process dead when its
heartbeats stop that long; at once when process 0, the service's host, is the lost one).
Rerunning every process's command resumes. With `--verbose` the console shows JAX's own
fatal message instead and the process aborts (jaxsocial.train.peers).
"""

import os
import signal
import sys

# What a stop signal interrupts while runner.train's own handler is not installed.
_PHASE = "during start-up (nothing to save)"


def _exit_on_stop_signal(signum, frame):  # noqa: ARG001
    # Before runner.train installs its own handler nothing exists that needs saving, and after
    # it returns everything is saved. os._exit, not sys.exit: a SystemExit raised inside a
    # half-done import (jax, orbax) can leave threads and atexit hooks that turn the exit
    # status into 1 at shutdown.
    sys.stderr.write(f"stopped by {signal.Signals(signum).name} {_PHASE}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_stop_signal)
    signal.signal(signal.SIGINT, _exit_on_stop_signal)

# The heavy imports come after the handler (ruff.toml exempts this file from E402).
import ast
import json
import logging as py_logging

from absl import app, flags, logging
from ml_collections import config_flags

from jaxsocial import cli
from jaxsocial.train import peers

_CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py",
                                          "Path to a config file (configs/*.py[:variant]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default runs/<config.name>).")
_RESUME = flags.DEFINE_bool("resume", True, "Resume from the workdir's latest checkpoint.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Full logs on the console instead of only in "
                             "workdir/train.log.")
_HEARTBEAT = flags.DEFINE_integer("heartbeat_timeout", peers.HEARTBEAT_TIMEOUT_S,
                                  "Multi-process runs: seconds without a heartbeat after which "
                                  "a process counts as lost and the others stop.", lower_bound=1)


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def parse_flags(argv):
    """absl's parser, but any error (an unknown --config key, a bad value, a config file
    that fails to load) is one line on stderr and exit status 2."""
    try:
        return cli.parse_flags(argv)  # --help exits 0
    except Exception as e:  # noqa: BLE001 -- flag and config-file errors of any kind
        text = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
        while len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
            try:  # ml_collections' KeyError text arrives quoted (repr) twice over
                text = str(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                break
        msg = _one_line(text)
        if isinstance(e, (KeyError, AttributeError)) and "--config." in " ".join(argv):
            msg += " (not a key of this config: see the config file or base_config)"
        sys.stderr.write(f"error: {msg}\n")
        sys.exit(2)


class _ConsoleHandler(py_logging.Handler):
    """Warnings and errors logged by this project's code (jaxsocial/, launch/) to the console,
    one line each, without breaking the progress bar."""

    def __init__(self, console):
        super().__init__(py_logging.WARNING)
        self.console = console
        import jaxsocial
        here = os.path.dirname(os.path.abspath(__file__))
        self.dirs = (os.path.dirname(os.path.abspath(jaxsocial.__file__)) + os.sep, here + os.sep)

    def emit(self, record):
        if not record.pathname.startswith(self.dirs):
            return
        try:
            from tqdm import tqdm
            level = record.levelname.lower()
            tqdm.write(f"{level}: {_one_line(record.getMessage(), 1000)}", file=self.console)
        except Exception:  # noqa: BLE001
            self.handleError(record)


def _log_to_file(path: str):
    """Point file descriptor 2 (absl/Python logging, XLA's C++ logs, stray warnings) at
    `path`; return a stream on the original stderr for the console."""
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(2), "w", buffering=1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    return console


def _entries(workdir: str):
    """The names in `workdir` before this launch (None: there is no workdir yet)."""
    try:
        return set(os.listdir(workdir))
    except FileNotFoundError:
        return None
    except OSError:  # a file, or unreadable: the checks name it; nothing will be undone
        return set()


# What a run writes before its first epoch: a refusal takes these back.
_START_UP = {"train.log", "run.lock", "checkpoints"}


def _undo_start(workdir: str, before, distributed: bool) -> bool:
    """Take back what this launch wrote when its run was refused before its first epoch:
    the workdir itself if it made it, else the start-up files it added. Nothing is touched
    once a checkpoint or a logged epoch exists, nor in a multi-process run (the peers share
    the workdir). True when the workdir is as it was before the launch."""
    import shutil

    after = _entries(workdir)
    if distributed or after is None:
        return after is None
    added = after - (before or set())
    ckpts = os.path.join(workdir, "checkpoints")
    if (not added <= _START_UP
            or ("checkpoints" in added and os.path.isdir(ckpts) and os.listdir(ckpts))):
        return False
    if before is None:
        shutil.rmtree(workdir, ignore_errors=True)
        return not os.path.exists(workdir)
    for name in added:
        path = os.path.join(workdir, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
    return True


def _await_lost_peer(e: BaseException, distributed: bool) -> None:
    """A collective that failed because a peer process vanished (Gloo: "Connection reset by
    peer"): wait for the coordination service's verdict, which ends this process with the
    lost-peer line (peers), rather than write a second, cryptic error line."""
    if distributed and peers.lost_peer_error(e):
        logging.info("a peer looks lost (%s): waiting up to %d s for the coordination "
                     "service's verdict", _one_line(e), peers.heartbeat_timeout_s() + 10)
        peers.await_verdict()


def _fail(console, line: str, distributed: bool) -> None:
    """The run's one error line and exit status 1; a multi-process run exits at once
    (peers.exit_with: no shutdown barrier with peers that wait for this process)."""
    if distributed:
        peers.exit_with(console, line)
    console.write(line + "\n")
    sys.exit(1)


def main(argv):
    del argv
    config = _CONFIG.value
    workdir = _WORKDIR.value or os.path.join("runs", config.name)
    console = sys.stderr
    log_path = None
    from jaxsocial.train import checks, fit, workdir_lock
    before = _entries(workdir)
    try:  # a config that fails its check writes nothing, not even the workdir
        checks.check(config)
        fit.check_state(config)  # the run's state against this machine's memory
        if config.train.get("preflight", ""):  # compiled for its target before anything else
            from jaxsocial.scale import preflight

            preflight.check(config)
        # Refused here too (runner.train takes the lock itself), so that a second run on a
        # live workdir does not write into the first one's train.log. Multi-host: process 0
        # holds the lock for all of them.
        if int(config.distributed.get("process_id", -1)) <= 0:
            workdir_lock.check_free(workdir)
        workdir_lock.prepare(workdir)
    except (ValueError, ImportError, FileNotFoundError, workdir_lock.WorkdirBusy) as e:
        console.write(f"error: {_one_line(e)}\n")
        sys.exit(1)
    if not _VERBOSE.value:
        pid = int(config.distributed.get("process_id", -1))
        log_path = os.path.join(workdir, "train.log" if pid <= 0 else f"train.{pid}.log")
        console = _log_to_file(log_path)
        logging.set_verbosity(logging.INFO)
        py_logging.getLogger().addHandler(_ConsoleHandler(console))
    where = f" (full log: {log_path})" if log_path else ""
    distributed = bool(config.distributed.enabled or os.environ.get("JAX_COORDINATOR_ADDRESS"))
    if distributed:  # a lost peer: one line and exit 1 (peers), not SIGABRT
        peers.set_heartbeat_timeout(_HEARTBEAT.value)
        if log_path:
            peers.install(console, workdir, log_path, config.distributed.get("process_id", -1),
                          config.distributed.get("num_processes", -1), _RESUME.value, where)
    # Imported outside the try: a SIGTERM during the import exits 0 through the start-up
    # handler, and the except clause below can always name checkpointing.CheckpointError.
    from jaxsocial.train import checkpointing, runner
    try:
        summary = runner.train(config, workdir, resume=_RESUME.value, progress=_PROGRESS.value,
                               progress_file=console, checked=True)
        global _PHASE
        _PHASE = "after the run returned (everything is saved)"
    except (ValueError, FileNotFoundError, OSError, checkpointing.CheckpointError,
            workdir_lock.WorkdirBusy) as e:
        _await_lost_peer(e, distributed)
        # bad config / resume refused / no good checkpoint / full disk / busy workdir: one line
        logging.info("run failed", exc_info=True)
        if (not isinstance(e, workdir_lock.WorkdirBusy)
                and _undo_start(workdir, before, bool(config.distributed.enabled))
                and not (log_path and os.path.exists(log_path))):
            where = ""  # the refusal took its own log back with everything else
        _fail(console, f"error: {_one_line(e)}{where}", distributed)
    except Exception as e:  # noqa: BLE001 -- anything else: one line, traceback in the log
        _await_lost_peer(e, distributed)
        logging.info("run failed", exc_info=True)
        _fail(console, f"error: {type(e).__name__}: {_one_line(e)}{where}", distributed)
    stopped = summary.get("stopped")
    if stopped and summary["epochs"] is None:
        console.write(f"stopped by {stopped} before the first epoch (nothing to save)\n")
        return
    if summary.get("already_finished"):
        repaired = summary.get("repaired")
        done = (f"rewrote the incomplete {', '.join(r + '/' for r in repaired)} from the final "
                f"checkpoint" if repaired else "nothing to do")
        console.write(f"run already finished: {workdir} holds epoch {summary['epochs']} of "
                      f"{config.train.epochs}, {done} (train further: "
                      f"--config.train.epochs=N --config.train.allow_config_change=True; "
                      f"start over: --noresume)\n")
        return
    if stopped:
        console.write(f"stopped by {stopped} after epoch {summary['epochs']} of "
                      f"{config.train.epochs}: checkpointed; rerun the same command to "
                      f"resume\n")
    from jaxsocial.train import report
    print(runner.format_summary(summary))
    print(report.console_story(summary, workdir,
                               config.reward.get("non_post_mode", "constant"),
                               random_model=not config.model.checkpoint))
    print(json.dumps({"workdir": workdir, "epochs": summary["epochs"]}))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
