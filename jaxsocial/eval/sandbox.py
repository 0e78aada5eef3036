"""Run untrusted Python programs (model-written code) in a contained child process.

Each program gets, where the OS allows it:

- its own PID, network, mount, IPC and UTS namespaces (Linux ``unshare``): the program is a child
  of a tiny init that is PID 1 of the namespace; when that init dies the kernel kills every
  process left in the namespace, double-forked daemons included. The network namespace has only a
  down loopback, so no socket reaches anything.
- a filesystem of its own (``capabilities()["view"]``): a read-only tmpfs root holding
  read-only binds of the interpreter, its standard library (lib-dynload included), the shared
  libraries these load (found with ``ldd``), ``/etc/ld.so.cache`` and five device nodes, a fresh
  ``/proc`` and private tmpfs for ``/tmp`` (its working directory) and ``/dev/shm``; entered
  with pivot_root (the host's tree is detached) or, where that fails, chroot. So no checkout,
  home directory, host temporary file, site-packages, ``/etc`` or shell. Where this cannot be
  built (probed once), a fresh tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock``
  instead, and every world-readable host file is visible (warned).
- an unprivileged, per-run uid/gid (no supplementary groups, ``no_new_privs``): it cannot write
  anything the host owns, read or signal the caller's processes (which also are invisible in its
  ``/proc``).
- rlimits: CPU seconds, address space and data (``memory_mb``), processes (RLIMIT_NPROC, per
  uid — enforced because the uid is not root), file size, open files, no core dumps; plus a
  cgroup (v1 or v2) bounding the memory and process count of the whole tree, where writable.
- an environment with none of the caller's variables; stdin ``/dev/null``; stdout/stderr capped.
- a wall-clock timeout after which the whole tree is SIGKILLed (SIGTERM handlers do not help).
- an init whose command line (``/proc/1/cmdline``, readable inside) is the interpreter and a
  fixed bootstrap: its configuration comes on stdin; and a cgroup namespace, so ``/proc/*/cgroup``
  shows "/" rather than host paths.
- a size limit (``max_program_bytes``): a longer program is not started ("failed", with both
  sizes in ``reason``); the tmpfs it is written to is sized to hold it.

Run cgroups are named ``jaxsocial-sandbox-<host pid>-<uid>``; the first ``capabilities()`` of a
process removes those whose host died without removing them (SIGKILL, OOM): empty, at least a
minute old, owner pid gone (or no owner recorded, the earlier naming).

After every run the host checks that no process of the run's uid is left (and SIGKILLs any it
finds, reporting it in ``SandboxResult.leaked``). Primitives that are unavailable (not root, no
namespaces, no cgroup) are skipped with a one-time warning; see ``capabilities()``.

The program "passes" when it exits with status 0. With ``run(..., result_channel=True)`` it
also gets the write end of a pipe on fd 3, returned as ``SandboxResult.channel``: a way for a
harness to return values for the caller to check (`jaxsocial.train.code_problems` does). Both
are the program's to choose: a caller scoring untrusted code must decide from values it checks
itself, not from the exit status or a marker the program could print.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Iterable, Sequence

from jaxsocial.eval import sandbox_init

STATUSES = ("passed", "failed", "timeout", "crashed")

# Per-run uids/gids are drawn from this range (far above any login or system account), so that
# RLIMIT_NPROC and the post-run sweep concern this run only.
_UID_BASE = 0x6A500000
_UID_SPAN = 1 << 24

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_NS_FLAGS = _CLONE_NEWNS | _CLONE_NEWUTS | _CLONE_NEWIPC | _CLONE_NEWPID | _CLONE_NEWNET

# The child's init (`sandbox_init.py`, a real module so it is linted and unit-tested) runs as
# `PYTHON -I -S -c _BOOTSTRAP` from its text, so nothing of jaxsocial is imported inside the
# sandbox. PYTHON is the interpreter the program runs with (its path is in the program's view
# anyway); the source, the configuration and the program come on stdin (`_init_input`), so
# that /proc/1/cmdline, which the program can read, shows nothing of the host.
with open(sandbox_init.__file__, encoding="utf-8") as _f:
    _INIT_SOURCE = _f.read()
_BOOTSTRAP = ("import sys; s = sys.stdin.buffer; "
              "exec(compile(s.read(int(s.readline())), 'sandbox_init.py', 'exec'), "
              "{'__name__': '__main__'})")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of one program.

    status: "passed" (exit 0), "failed" (non-zero exit, output over the cap, or a program over
    `max_program_bytes`, which is not run), "timeout" (wall-clock or CPU limit), "crashed"
    (killed by a signal, or the sandbox could not start it). `reason` says which, in words.
    """

    status: str
    stdout: str
    stderr: str
    returncode: int | None  # exit status; -N when killed by signal N; None on timeout/crash
    reason: str
    duration_s: float
    truncated: bool = False
    leaked: int = 0  # processes of the run's uid found (and killed) after it ended
    channel: bytes | None = None  # what the program wrote to fd 3 (run(result_channel=True))


_warned: set[str] = set()
_caps_lock = threading.RLock()
_caps: dict | None = None


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"jaxsocial.eval.sandbox: {msg}", RuntimeWarning, stacklevel=3)


def _default_python() -> str:
    """An interpreter the unprivileged uid can execute and whose stdlib it can read."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)

    def world_usable(path: str) -> bool:
        parts = path.split(os.sep)
        for i in range(2, len(parts) + 1):
            p = os.sep.join(parts[:i]) or os.sep
            try:
                mode = os.stat(p).st_mode
            except OSError:
                return False
            if not mode & 0o001:
                return False
        return True

    if os.geteuid() != 0 or (world_usable(exe) and world_usable(prefix)):
        return exe
    for cand in (f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}", "/usr/bin/python3"):
        if os.path.exists(cand) and world_usable(os.path.realpath(cand)):
            _warn_once("python", f"{exe} is not readable by an unprivileged uid; "
                       f"sandboxed programs run with {cand}")
            return cand
    return exe


def _probe_namespaces() -> bool:
    probe = (
        "import ctypes,os,sys\n"
        "libc=ctypes.CDLL(None,use_errno=True)\n"
        f"sys.exit(0 if libc.unshare({_NS_FLAGS})==0 and "
        "libc.mount(b'none',b'/',None,16384|(1<<18),None)==0 else 1)\n")
    try:
        return subprocess.run([sys.executable, "-I", "-S", "-c", probe], env={},
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _cgroup_roots() -> dict:
    """Writable cgroup controllers: {"v2": path} or {"memory": path, "pids": path} (v1)."""
    roots = {}
    v2 = "/sys/fs/cgroup"
    for cand in (v2, "/sys/fs/cgroup/unified"):
        try:
            with open(os.path.join(cand, "cgroup.controllers")) as f:
                ctl = f.read().split()
            with open(os.path.join(cand, "cgroup.subtree_control")) as f:
                sub = f.read().split()
        except OSError:
            continue
        if {"memory", "pids"} <= set(ctl) and {"memory", "pids"} <= set(sub) \
                and os.access(cand, os.W_OK):
            return {"v2": cand}
    for ctl in ("memory", "pids"):
        p = os.path.join(v2, ctl)
        if os.path.isfile(os.path.join(p, "cgroup.procs")) and os.access(p, os.W_OK):
            roots[ctl] = p
    return roots if len(roots) == 2 else {}


# Asked of the sandbox's interpreter: where its executable, standard library (with lib-dynload)
# and site-packages are.
_VIEW_QUERY = r'''
import json, os, site, sys, sysconfig
p = sysconfig.get_paths()
stdlib = [p["stdlib"], p["platstdlib"]] + [d for d in sys.path if d.endswith("lib-dynload")]
sites = site.getsitepackages() + [site.getusersitepackages(), p["purelib"], p["platlib"]]
print(json.dumps({"stdlib": stdlib, "site": sites}))
'''
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# pivot_root(2) has no glibc wrapper; its syscall number per architecture (else chroot).
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203,
                  "s390x": 217, "i686": 217, "armv7l": 218}


def _resolve_into(path: str, binds: set, links: dict, depth: int = 0) -> None:
    """Make absolute `path` resolvable inside the view: every symlink on the way is recreated
    (in `links`) and followed; the real path at the end is bound (added to `binds`)."""
    if depth > 40:
        raise OSError(f"too many symlinks resolving {path}")
    parts = [p for p in path.split("/") if p]
    cur = ""
    for i, part in enumerate(parts):
        cur += "/" + part
        if os.path.islink(cur):
            target = os.readlink(cur)
            links[cur] = target
            rest = "/".join(parts[i + 1:])
            real = os.path.normpath(os.path.join(os.path.dirname(cur), target))
            _resolve_into(real + ("/" + rest if rest else ""), binds, links, depth + 1)
            return
    if os.path.exists(cur):
        binds.add(cur)


def _shared_library_dirs(files: Sequence[str]) -> set:
    """Directories of the shared libraries `files` load (as the dynamic loader names them and
    as they really are), from ``ldd``; the usual library directories when ldd is missing."""
    try:
        out = subprocess.run(["ldd", *files], capture_output=True, text=True, env={},
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    libs = set()
    for line in out.splitlines():
        tok = line.split()
        if "=>" in tok and tok.index("=>") + 1 < len(tok):
            tok = tok[tok.index("=>") + 1:]
        if tok and tok[0].startswith("/") and not tok[0].endswith(":"):
            libs.add(tok[0])
    if not libs:
        _warn_once("ldd", "ldd gave no answer; the sandbox's view binds the usual library "
                   "directories whole")
        return {d for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d)}
    return {os.path.dirname(p) for p in libs} | {os.path.dirname(os.path.realpath(p))
                                                  for p in libs}


def _view_plan(python: str) -> list:
    """The sandbox's whole filesystem, as entries ("bind", path) (read-only bind of the host
    path), ("link", path, target), ("hide", path) (an empty read-only tmpfs over a directory
    the binds would show) and ("dev", path): the interpreter, its standard library, the shared
    libraries it and its extension modules load, /etc/ld.so.cache and five device nodes.
    /proc, /tmp and /dev/shm are added by the init. No site-packages, no home, no checkout."""
    info = json.loads(subprocess.run([python, "-I", "-c", _VIEW_QUERY], capture_output=True,
                                     text=True, env={}, timeout=60, check=True).stdout)
    stdlib = [d for d in dict.fromkeys(info["stdlib"]) if os.path.isdir(d)]
    ext = [os.path.join(d, f) for d in stdlib if d.endswith("lib-dynload")
           for f in sorted(os.listdir(d)) if f.endswith(".so")]
    binds, links = set(), {}
    wanted = [python, *stdlib, *_shared_library_dirs([python, *ext])]
    if os.path.isfile("/etc/ld.so.cache"):
        wanted.append("/etc/ld.so.cache")
    for path in wanted:
        _resolve_into(os.path.abspath(path), binds, links)

    def inside(path, dirs):
        return any(path.startswith(d.rstrip("/") + "/") for d in dirs)

    binds = sorted(b for b in binds if not inside(b, binds))  # a bound dir shows its subdirs
    plan = [("bind", b) for b in binds]
    plan += [("link", p, t) for p, t in sorted(links.items()) if not inside(p, binds)]
    hides = {os.path.realpath(d) for d in info["site"] if d}
    plan += [("hide", d) for d in sorted(hides) if os.path.isdir(d) and inside(d, binds)]
    plan += [("dev", d) for d in _DEVICES if os.path.exists(d)]
    return plan


# Run in a sandbox with the view: must import the common standard library and see none of
# the paths listed (filled in at probe time).
_VIEW_PROBE = r'''
import collections, datetime, decimal, hashlib, heapq, itertools, json, math, os, random, re
print(json.dumps([p for p in %r if os.path.exists(p)]))
'''


def _probe_view(caps: dict) -> list | None:
    try:
        plan = _view_plan(caps["python"])
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        _warn_once("view", f"could not plan a private filesystem view ({e}); sandboxed "
                   "programs can read every world-readable host file")
        return None
    here = os.path.abspath(__file__)
    hidden = [here, os.path.dirname(here), "/etc/passwd"]
    r = _run(dict(caps, view=plan), _VIEW_PROBE % (hidden,), 30.0, 256, 16, 16, 64, 1 << 16,
             caps["python"], False)
    if r.status != "passed" or r.stdout.strip() != "[]":
        why = r.stdout.strip() or r.reason + ": " + (r.stderr.strip().splitlines() or [""])[-1]
        _warn_once("view", f"the private filesystem view does not work here ({why}); "
                   "sandboxed programs can read every world-readable host file")
        return None
    return plan


def capabilities() -> dict:
    """Which containment primitives this host offers (probed once, cached).

    Keys: drop_uid, namespaces, cgroup, python (the interpreter programs run with), view (the
    filesystem the program sees, see `_view_plan`; None when the host's files are visible)."""
    global _caps
    with _caps_lock:
        if _caps is None:
            root = os.geteuid() == 0
            caps = {
                "drop_uid": root,
                "namespaces": _probe_namespaces(),
                "cgroup": _cgroup_roots() if root else {},
                "python": _default_python(),
                "view": None,
            }
            if caps["cgroup"]:  # before any run of ours: what killed hosts left
                _remove_leftover_cgroups(caps["cgroup"])
            if caps["namespaces"]:
                caps["view"] = _probe_view(caps)
            else:
                _warn_once("view", "no mount namespace: sandboxed programs can read every "
                           "world-readable host file")
            if not caps["drop_uid"]:
                _warn_once("uid", "not running as root: programs keep the caller's uid "
                           "(RLIMIT_NPROC counts all of the caller's processes; files the "
                           "caller can write are writable)")
            if not caps["namespaces"]:
                _warn_once("ns", "Linux namespaces unavailable: no network isolation, "
                           "stray processes are killed by uid/process group instead")
            if not caps["cgroup"]:
                _warn_once("cgroup", "no writable cgroup: memory is bounded per process "
                           "(RLIMIT_AS) only, not for the whole process tree")
            _caps = caps
        return _caps


def _uid_pids(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(name))
                        break
        except (OSError, ValueError):
            continue
    return pids


def _kill_uid(uid: int, python: str, wait_s: float = 0.0) -> int:
    """SIGKILL every process of `uid` still alive after `wait_s` (time for a dying PID namespace
    to empty itself); returns how many were left. kill(-1) issued *as* that uid reaches exactly
    its processes, atomically with respect to forks."""
    end = time.monotonic() + wait_s
    left = _uid_pids(uid)
    while left and time.monotonic() < end:
        time.sleep(0.01)
        left = _uid_pids(uid)
    for _ in range(50):
        if not _uid_pids(uid):
            break
        subprocess.run([python, "-I", "-S", "-c",
                        "import os,signal; os.kill(-1, signal.SIGKILL)"],
                       user=uid, group=uid, extra_groups=[], env={}, check=False)
        time.sleep(0.01)
    return len(left)


def _allocate_uid() -> int:
    while True:
        uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
        if not _uid_pids(uid):
            return uid


# A run's cgroup is `<root>/jaxsocial-sandbox-<host pid>-<uid>`: the host pid says whose it is,
# so that the next process to start can remove those a killed host (SIGKILL, OOM) left behind.
_CGROUP_PREFIX = "jaxsocial-sandbox-"
# Only cgroups at least this old are removed: a live run's cgroup is empty only for the moment
# between its creation and its init joining it, or after its end before the host removes it.
_LEFTOVER_MIN_AGE_S = 60.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no pid that large
        return False
    except PermissionError:
        return True
    return True


def _cgroup_empty(path: str) -> bool:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return not f.read().strip()
    except OSError:
        return False


def _leftover_cgroups(roots: dict, min_age_s: float = _LEFTOVER_MIN_AGE_S,
                      pid_alive=_pid_alive) -> list[str]:
    """The run cgroups under `roots` (see `_cgroup_roots`) that no live host owns: named
    `jaxsocial-sandbox-<pid>-<uid>` with `pid` dead, or `jaxsocial-sandbox-<uid>` (the earlier
    naming, no owner recorded), holding no process, and at least `min_age_s` old."""
    now = time.time()
    found = []
    for root in dict.fromkeys(roots.values()):
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            parts = name[len(_CGROUP_PREFIX):].split("-")
            if not name.startswith(_CGROUP_PREFIX) or len(parts) not in (1, 2) \
                    or not all(p.isdigit() for p in parts):
                continue
            path = os.path.join(root, name)
            try:
                age = now - os.stat(path).st_mtime  # cgroupfs: the creation time
            except OSError:
                continue
            if age >= min_age_s and not (len(parts) == 2 and pid_alive(int(parts[0]))) \
                    and _cgroup_empty(path):
                found.append(path)
    return found


def _remove_leftover_cgroups(roots: dict, min_age_s: float = _LEFTOVER_MIN_AGE_S) -> list[str]:
    """rmdir `_leftover_cgroups` (the kernel refuses a cgroup that holds a process); -> removed."""
    removed = []
    for path in _leftover_cgroups(roots, min_age_s):
        try:
            os.rmdir(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _make_cgroup(roots: dict, uid: int, memory_mb: int, max_processes: int) -> list[str]:
    dirs = []
    name = f"{_CGROUP_PREFIX}{os.getpid()}-{uid}"
    try:
        if "v2" in roots:
            d = os.path.join(roots["v2"], name)
            os.mkdir(d)
            dirs.append(d)
            _write(os.path.join(d, "memory.max"), str(memory_mb << 20))
            _write(os.path.join(d, "memory.swap.max"), "0", optional=True)
            _write(os.path.join(d, "pids.max"), str(max_processes))
        else:
            d = os.path.join(roots["memory"], name)
            os.mkdir(d)
            dirs.append(d)
            _write(os.path.join(d, "memory.limit_in_bytes"), str(memory_mb << 20))
            d = os.path.join(roots["pids"], name)
            os.mkdir(d)
            dirs.append(d)
            _write(os.path.join(d, "pids.max"), str(max_processes))
    except OSError as e:
        _remove_cgroups(dirs)
        _warn_once("cgroup-mk", f"could not create a cgroup ({e}); memory is bounded per process")
        return []
    return dirs


def _write(path: str, value: str, optional: bool = False) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError:
        if not optional:
            raise


def _remove_cgroups(dirs: Iterable[str]) -> None:
    for d in dirs:
        for _ in range(100):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def _check_args(code, timeout_s, memory_mb, max_processes, max_file_mb, max_output_bytes,
                max_program_bytes):
    if not isinstance(code, (str, bytes)):
        raise TypeError(f"code must be str or bytes, got {type(code).__name__}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    for name, v, lo in (("memory_mb", memory_mb, 32), ("max_processes", max_processes, 1),
                        ("max_file_mb", max_file_mb, 1), ("max_output_bytes", max_output_bytes, 1),
                        ("max_program_bytes", max_program_bytes, 1)):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


def run(code: str | bytes, timeout_s: float = 10.0, memory_mb: int = 1024, *,
        max_processes: int = 32, max_file_mb: int = 16, max_open_files: int = 64,
        max_output_bytes: int = 1 << 20, max_program_bytes: int = 1 << 24,
        python: str | None = None, result_channel: bool = False) -> SandboxResult:
    """Run Python source `code` as ``python -I program.py`` in a fresh sandbox.

    timeout_s: wall-clock seconds for the program (setup excluded); RLIMIT_CPU = ceil + 1.
    memory_mb: RLIMIT_AS/RLIMIT_DATA per process and, with a cgroup, the whole tree's memory.
    max_processes: RLIMIT_NPROC (and cgroup pids.max). max_file_mb: RLIMIT_FSIZE and tmpfs size.
    max_output_bytes: cap on each of stdout/stderr (and the result channel); a program
    exceeding it is killed and reported "failed" with ``truncated=True``.
    max_program_bytes: the largest program (UTF-8 bytes) run; a longer one is not started and
    comes back "failed", its reason giving both sizes. The program's tmpfs has room for it on
    top of the ``2 * max_file_mb`` the program may write.
    result_channel: the program finds the write end of a pipe on fd 3; what it writes there
    comes back as ``SandboxResult.channel``, apart from stdout. It is as much the program's as
    stdout is: a caller scoring the program must check its content, not trust it.
    """
    _check_args(code, timeout_s, memory_mb, max_processes, max_file_mb, max_output_bytes,
                 max_program_bytes)
    data = code.encode("utf-8") if isinstance(code, str) else code
    if len(data) > max_program_bytes:
        return SandboxResult("failed", "", "", None,
                             f"the program is {len(data)} bytes, over the limit of "
                             f"{max_program_bytes} bytes (max_program_bytes); not run", 0.0,
                             channel=b"" if result_channel else None)
    caps = capabilities()
    if python and python != caps["python"] and caps["view"] is not None:
        caps = dict(caps, view=_other_view(python))
    return _run(caps, data, timeout_s, memory_mb, max_processes, max_file_mb, max_open_files,
                max_output_bytes, python or caps["python"], result_channel)


_other_views: dict = {}


def _other_view(python: str) -> list | None:
    with _caps_lock:
        if python not in _other_views:
            try:
                _other_views[python] = _view_plan(python)
            except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
                _warn_once("view-" + python, f"no private filesystem view for {python} ({e})")
                _other_views[python] = None
        return _other_views[python]


def _run(caps, code, timeout_s, memory_mb, max_processes, max_file_mb, max_open_files,
         max_output_bytes, python, result_channel) -> SandboxResult:
    data = code.encode("utf-8") if isinstance(code, str) else code  # _probe_view passes str
    uid = _allocate_uid() if caps["drop_uid"] else os.getuid()
    gid = uid if caps["drop_uid"] else os.getgid()
    cgroups = _make_cgroup(caps["cgroup"], uid, memory_mb, max_processes) if caps["cgroup"] else []
    workdir = None
    if not caps["namespaces"]:
        workdir = tempfile.mkdtemp(prefix="jaxsocial-sandbox-")
    mem = memory_mb << 20
    rlimits = [("RLIMIT_CPU", int(timeout_s) + 2), ("RLIMIT_AS", mem), ("RLIMIT_DATA", mem),
               ("RLIMIT_FSIZE", max_file_mb << 20), ("RLIMIT_NOFILE", max_open_files),
               ("RLIMIT_CORE", 0)]
    if caps["drop_uid"]:  # for a shared uid this would count the caller's own processes
        rlimits.append(("RLIMIT_NPROC", max_processes))
    status_r, status_w = os.pipe()
    chan_r, chan_w = os.pipe() if result_channel else (None, None)
    cfg = {
        "status_fd": status_w, "host_pid": os.getpid(), "uid": uid, "gid": gid,
        "drop_uid": caps["drop_uid"], "namespaces": caps["namespaces"], "ns_flags": _NS_FLAGS,
        "cgroup_procs": [os.path.join(d, "cgroup.procs") for d in cgroups],
        "tmpfs_kb": (max_file_mb << 10) * 2, "program_kb": _program_kb(len(data)),
        "workdir": workdir, "rlimits": rlimits,
        "python": python, "view": caps["view"] if caps["namespaces"] else None,
        "pivot_root_nr": _PIVOT_ROOT_NR.get(os.uname().machine), "channel_fd": chan_w,
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                "PYTHONHASHSEED": "0"},
    }
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            [python, "-I", "-S", "-c", _BOOTSTRAP],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(status_w,) + ((chan_w,) if result_channel else ()), env={},
            start_new_session=True, close_fds=True)
    finally:
        os.close(status_w)
        if chan_w is not None:
            os.close(chan_w)
    try:
        result = _supervise(proc, _init_input(cfg, data), status_r, chan_r, timeout_s,
                            max_output_bytes, t0)
    finally:
        os.close(status_r)
        if chan_r is not None:
            os.close(chan_r)
        if proc.poll() is None:
            _killpg(proc)
        proc.wait()
        leaked = (_kill_uid(uid, python, 2.0 if caps["namespaces"] else 0.0)
                  if caps["drop_uid"] else 0)
        _remove_cgroups(cgroups)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    if leaked:
        result = dataclasses.replace(result, leaked=leaked)
    return result


def _program_kb(nbytes: int) -> int:
    """tmpfs room (KiB) for a program of `nbytes`: whole 4 KiB pages, and a margin."""
    return -(-nbytes // 4096) * 4 + 64


def _init_input(cfg: dict, data: bytes) -> bytes:
    """The init's stdin: its source (length-prefixed, read by `_BOOTSTRAP`), the configuration
    as one JSON line, then the program."""
    src = _INIT_SOURCE.encode("utf-8")
    return b"%d\n" % len(src) + src + json.dumps(cfg).encode() + b"\n" + data


def _signame(sig: int) -> str:
    return signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _supervise(proc, data, status_r, chan_r, timeout_s, cap, t0) -> SandboxResult:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    sel = selectors.DefaultSelector()
    bufs = {"stdout": bytearray(), "stderr": bytearray(), "status": bytearray(),
            "channel": bytearray()}
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    sel.register(status_r, selectors.EVENT_READ, "status")
    if chan_r is not None:
        sel.register(chan_r, selectors.EVENT_READ, "channel")
    setup_deadline = t0 + max(30.0, timeout_s)  # a loaded host can be slow to start Python
    deadline = None
    started = None
    timed_out = truncated = False
    open_streams = 3 if chan_r is None else 4
    while open_streams:
        now = time.monotonic()
        if deadline is None and b"started\n" in bufs["status"]:
            started = now
            deadline = now + timeout_s
        limit = deadline if deadline is not None else setup_deadline
        if now >= limit:
            timed_out = True
            break
        for key, _ in sel.select(timeout=limit - now):
            fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
            chunk = os.read(fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            buf = bufs[key.data]
            buf += chunk
            if key.data != "status" and len(buf) > cap:
                del buf[cap:]
                truncated = True
        if truncated:
            break
        # Stage 2 reported the program's end: its namespace is gone, so EOF follows at once;
        # without namespaces a daemon may hold the pipes, so stop waiting after a grace period.
        if any(bufs["status"].startswith(p) or b"\n" + p in bufs["status"]
               for p in (b"exit ", b"signal ", b"error ")) and proc.poll() is not None:
            grace = time.monotonic() + 0.5
            while open_streams and time.monotonic() < grace:
                for key, _ in sel.select(timeout=max(0.0, grace - time.monotonic())):
                    fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                    elif key.data != "status":
                        bufs[key.data] += chunk[: max(0, cap - len(bufs[key.data]))]
            break
    sel.close()
    if timed_out or truncated:
        _killpg(proc)
    duration = time.monotonic() - (started or t0)
    out = bufs["stdout"].decode("utf-8", "replace")
    err = bufs["stderr"].decode("utf-8", "replace")
    lines = bufs["status"].decode("utf-8", "replace").split("\n")
    final = next((ln for ln in reversed(lines) if ln and ln != "started"), "")

    def res(status, rc, reason):
        return SandboxResult(status, out, err, rc, reason, duration, truncated,
                             channel=None if chan_r is None else bytes(bufs["channel"]))

    if timed_out:
        return res("timeout", None, f"wall-clock timeout after {timeout_s:g}s"
                   if started else "sandbox setup did not finish")
    if truncated:
        return res("failed", None, f"output exceeded {cap} bytes")
    if final.startswith("exit "):
        rc = int(final.split()[1])
        return res("passed" if rc == 0 else "failed", rc, f"exit status {rc}")
    if final.startswith("signal "):
        sig = int(final.split()[1])
        name = _signame(sig)
        if sig == signal.SIGXCPU:
            return res("timeout", -sig, "CPU time limit (SIGXCPU)")
        return res("crashed", -sig, f"killed by {name}")
    if final.startswith("error "):
        return res("crashed", None, "sandbox setup failed: " + final[6:])
    try:  # every stream is closed: the init is gone or going
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        code = None
    # Stage 1 exits as PID 1 did, a signal N as 128 + N.
    sig = -code if code is not None and code < 0 else code - 128 if code and code > 128 else 0
    how = ("" if code is None else f": the init was killed by {_signame(sig)}" if sig
           else f": the init exited with code {code}, see stderr")
    return res("crashed", None, "sandbox exited without a status" + how)


def run_many(codes: Sequence[str | bytes], *, max_workers: int | None = None,
             **kwargs) -> list[SandboxResult]:
    """`run` each program, up to `max_workers` (default: CPU count) at a time; results in order."""
    codes = list(codes)
    if not codes:
        return []
    workers = max_workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers!r}")
    workers = min(workers, len(codes), os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(lambda c: run(c, **kwargs), codes))
