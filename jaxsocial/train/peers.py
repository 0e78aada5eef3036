"""A lost peer in a multi-process run: one `error:` line and exit status 1, not SIGABRT.

What a survivor goes through when a peer process dies (kill -9, a crash, its host going down),
as observed with jax/jaxlib 0.10 on two localhost processes:

- Its main thread is usually blocked in a collective (Gloo waits for the dead peer, e.g. while
  setting up a new communicator through the coordination service) and raises nothing. Sometimes
  the collective fails first ("Gloo AllGather failed: ... Connection reset by peer").
- The coordination service (on process 0) declares a task dead once it has sent no heartbeat
  for the heartbeat timeout (JAX's default is 100 s; it fires between about 0.6x and 1x the
  timeout). The service sends that verdict to every task through the client's error polling,
  and the client's default handler is a fatal C++ log line, "Terminating process because the
  JAX distributed service detected fatal errors ... The following tasks are unhealthy (stopped
  sending heartbeats): 1", then `abort()`: exit 134, the reason only in the log.
- If process 0 itself dies, the coordination service dies with it and every other process's
  error poll fails at once ("Failed to send RPC to coordination service"): the same abort
  within a second.

The client's handler cannot be replaced from Python in this jaxlib:
`get_distributed_runtime_client(missed_heartbeat_callback=...)` exists, but calling a Python
callback with the absl::Status fails to convert it (std::bad_cast, std::terminate). And no
Python-side watchdog can beat the instant abort when process 0 is lost. So the abort itself is
turned into the line: `install` points SIGABRT at a handler (ctypes) that reads the fatal
message from the tail of the run's log (fd 2 goes there), and, when it is the coordination
service's verdict, writes one `error:` line naming the lost process and the newest checkpoint
to the console and ends the process with `os._exit(1)`. Any other abort goes on as before
(Python tracebacks into the log, then SIGABRT). `lost_peer_error` recognises a collective that
failed because its peer vanished; launch/train.py then waits for the verdict
(`await_verdict`) instead of writing a second, cryptic error line. A process that fails on an
error of its own leaves at once (`exit_with`): JAX's atexit shutdown barrier would otherwise
hold it for minutes while its peers wait for it in a collective.

`HEARTBEAT_TIMEOUT_S` is the heartbeat timeout this project passes to
`jax.distributed.initialize` (`sharding.maybe_initialize_distributed`); launch/train.py's
`--heartbeat_timeout` changes it. Shorter means a lost host is noticed sooner; long enough
that a busy host is not taken for a dead one (heartbeats come from a C++ thread, not Python).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import signal
import sys
import threading
import time
from typing import List, Optional, Tuple

HEARTBEAT_TIMEOUT_S = 30

# The coordination service's fatal error, as the client logs it before abort().
FATAL_MARK = "Terminating process because the JAX distributed service detected fatal errors"
_UNHEALTHY = "The following tasks are unhealthy (stopped sending heartbeats):"
_LEADER_LOST = ("Failed to send RPC to coordination service", "leader task was preempted",
                "Socket closed", "failed to connect to all addresses")
# What a collective raises when the peer at the other end of its socket went away.
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "Gloo", "coordination service", "Failed to send RPC", "Socket closed")

_state = {"timeout_s": HEARTBEAT_TIMEOUT_S, "installed": None, "handler": None, "fired": False,
          "exiting": False}
_lock = threading.Lock()
_line_lock = threading.Lock()  # one line on the console: the lost peer's or the run's own


def heartbeat_timeout_s() -> int:
    """The heartbeat timeout multi-process runs use (seconds)."""
    return int(_state["timeout_s"])


def set_heartbeat_timeout(seconds: int) -> None:
    if int(seconds) < 1:
        raise ValueError(f"heartbeat timeout {seconds}: must be at least 1 second")
    _state["timeout_s"] = int(seconds)


def log_name(process_id: int) -> str:
    """The log launch/train.py writes for a process of the run (in its workdir)."""
    return "train.log" if process_id <= 0 else f"train.{process_id}.log"


def checkpoint_steps(workdir: str) -> List[int]:
    """The steps of the complete checkpoints under workdir/checkpoints (orbax writes a step
    into `<step>.orbax-checkpoint-tmp` and renames it when complete), oldest first. Read from
    the directory, not through orbax: a lost peer leaves orbax's barriers unusable."""
    try:
        names = os.listdir(os.path.join(workdir, "checkpoints"))
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit()
                  and os.path.isdir(os.path.join(workdir, "checkpoints", n)))


def lost_tasks(text: str) -> Optional[Tuple[str, List[int]]]:
    """The coordination service's verdict in a log's text: ("unhealthy", [task ids]) when tasks
    stopped sending heartbeats, ("leader", [0]) when the service (process 0) cannot be reached,
    ("other", []) for another fatal error of the service; None when `text` holds none."""
    i = text.rfind(FATAL_MARK)
    if i < 0:
        return None
    fatal = text[i:]
    j = fatal.find(_UNHEALTHY)
    if j >= 0:
        ids = []
        for line in fatal[j + len(_UNHEALTHY):].splitlines():
            line = line.strip()
            if not line:
                continue
            m = re.fullmatch(r"(?:/job:[^/]+/replica:\d+/task:)?(\d+)", line)
            if not m:
                break
            ids.append(int(m.group(1)))
        return "unhealthy", ids
    if any(s in fatal for s in _LEADER_LOST):
        return "leader", [0]
    return "other", []


def _status_line(fatal: str, limit: int = 300) -> str:
    """The first line of the absl::Status in the client's fatal message."""
    i = fatal.find("absl::Status:")
    text = fatal[i + len("absl::Status:"):] if i >= 0 else fatal
    text = " ".join(text.strip().splitlines()[:1]).strip() if text.strip() else ""
    return text if len(text) <= limit else text[:limit] + "..."


def lost_host_line(fatal_text: str, workdir: str, process_id: int, num_processes: int,
                   resume: bool = True, where: str = "") -> Optional[str]:
    """The one console line for a survivor of a lost peer, or None when `fatal_text` holds no
    fatal error of the coordination service (nothing was lost: the caller keeps its own)."""
    verdict = lost_tasks(fatal_text)
    if verdict is None:
        return None
    kind, ids = verdict
    others = [i for i in ids if i != process_id]
    of = f" of {num_processes}" if num_processes > 0 else ""
    timeout = heartbeat_timeout_s()
    if kind == "unhealthy" and others:
        names = ", ".join(str(i) for i in others)
        log = (f"; its log: {os.path.join(workdir, log_name(others[0]))}"
               if len(others) == 1 else "")
        what = (f"lost process {names}{of}: no heartbeat reached the coordination service for "
                f"{timeout} s (killed, crashed, failed or its host went down{log})")
    elif kind == "unhealthy" and ids:
        what = (f"the coordination service took this process ({process_id}{of}) for dead: its "
                f"heartbeats stopped for {timeout} s (a stalled host or network?)")
    elif kind == "leader" and process_id != 0:
        what = (f"lost process 0{of}, the coordination service's host: it cannot be reached "
                f"(killed, crashed or its host went down)")
    else:
        status = _status_line(fatal_text[fatal_text.rfind(FATAL_MARK):])
        what = f"the coordination service stopped the run: {status}"
    steps = checkpoint_steps(workdir)
    again = "the same commands" + ("" if resume else " without --noresume")
    if steps:
        then = f"resume from checkpoint {steps[-1]} by rerunning {again} on every process"
    else:
        then = f"no checkpoint was saved yet: rerunning {again} on every process starts over"
    return f"error: {what}; process {process_id} stops too; {then}{where}"


def _tail(path: Optional[str], size: int = 65536) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _ids(info) -> Tuple[int, int]:
    """This process's id and the number of processes: as configured, else as
    jax.distributed resolved them (plain attributes, no call into the client)."""
    pid, n = info["process_id"], info["num_processes"]
    if pid < 0 or n < 1:
        try:  # sys.modules, not an import: the main thread may hold the import lock
            st = sys.modules["jax._src.distributed"].global_state
            pid = pid if pid >= 0 else int(st.process_id)
            n = n if n >= 1 else int(st.num_processes or 0)
        except Exception:  # noqa: BLE001
            pid = max(pid, 0)
    return pid, n


def _on_abort(signum):  # noqa: ARG001
    # Runs in the aborting C++ thread (the client's error poll) once it holds the GIL. Touch
    # nothing of JAX here: the client's own lock is held by that thread (a key-value call from
    # here deadlocks). Files, os.write and os._exit only.
    info = _state["installed"]
    if info is None or _state["fired"]:
        return
    _state["fired"] = True
    try:
        faulthandler.dump_traceback(all_threads=True)  # where every thread was, into the log
        pid, n = _ids(info)
        line = lost_host_line(_tail(info["log_path"]), info["workdir"], pid, n,
                              info["resume"], info["where"])
        if line is None:  # not the coordination service: abort as before
            return
        with _line_lock:
            if _state["exiting"]:  # this process's own error line is out: that one stands
                os._exit(1)
            os.write(2, f"peers: the coordination service's fatal error above; on the "
                        f"console: {line}\n".encode())
            fd = info["console_fd"]
            prefix = "\r\x1b[K" if os.isatty(fd) else ""  # over a progress bar's half line
            os.write(fd, (prefix + line + "\n").encode())
    except BaseException:  # noqa: BLE001 -- never return into abort() half done
        pass
    os._exit(1)


def install(console, workdir: str, log_path: str, process_id: Optional[int] = None,
            num_processes: Optional[int] = None, resume: bool = True, where: str = "") -> bool:
    """Turn the coordination service's fatal abort (a peer process lost) into one `error:`
    line on `console` and exit status 1. `log_path`: the file fd 2 writes to, where the
    client's fatal message lands before abort() (launch/train.py's train.log). `process_id`,
    `num_processes`: None or -1 when jax.distributed detects them. POSIX libc; False where the
    handler cannot be installed."""
    with _lock:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            handler_t = ctypes.CFUNCTYPE(None, ctypes.c_int)
            handler = handler_t(_on_abort)
            libc.signal.restype = ctypes.c_void_p
            libc.signal.argtypes = [ctypes.c_int, handler_t]
        except (OSError, AttributeError):
            return False
        _state["installed"] = dict(console_fd=console.fileno(), workdir=workdir,
                                   log_path=log_path,
                                   process_id=-1 if process_id is None else int(process_id),
                                   num_processes=-1 if num_processes is None
                                   else int(num_processes), resume=bool(resume),
                                   where=where)
        _state["handler"] = handler  # a live reference: the C side only holds the pointer
        _state["fired"] = False
        return libc.signal(signal.SIGABRT, handler) != ctypes.c_void_p(-1).value


def exit_with(console, line: str) -> None:
    """End a multi-process run that failed here: `line` on the console, exit status 1, at once.
    Not sys.exit: JAX's atexit hook would wait in the coordination service's shutdown barrier
    for peers that are themselves blocked waiting for this process (5 minutes, then SIGABRT);
    gone at once, this process is a lost peer to them, and they stop within the heartbeat
    timeout. A lost-peer verdict arriving meanwhile adds no second line."""
    import logging

    with _line_lock:
        _state["exiting"] = True
        console.write(line + "\n")
        console.flush()
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def lost_peer_error(e: BaseException) -> bool:
    """Whether an exception looks like a collective or coordination call that failed because
    a peer process vanished (the coordination service's verdict follows within the timeout)."""
    text = f"{type(e).__name__}: {e}"
    return any(s in text for s in _PEER_GONE)


def await_verdict(grace_s: float = 10.0) -> None:
    """Wait for the coordination service's verdict on a lost peer (the SIGABRT handler ends the
    process with the one line): at most the heartbeat timeout plus `grace_s`. Returns when no
    verdict came (the caller reports its own error)."""
    if _state["installed"] is None:
        return
    deadline = time.monotonic() + heartbeat_timeout_s() + grace_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
