"""The sandbox contains hostile programs and the host stays unharmed.

Every test uses small limits (<= 256 MB, <= 16 processes, <= 3 s) so that a containment bug
cannot take the shared machine down, and checks afterwards that no process of a sandbox uid is
left and no file appeared outside the sandbox.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings

import pytest

from jaxsocial.eval import sandbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

LIMITS = dict(timeout_s=3.0, memory_mb=256, max_processes=16)


def _sandbox_pids():
    lo, hi = sandbox._UID_BASE, sandbox._UID_BASE + sandbox._UID_SPAN
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uid = os.stat(f"/proc/{name}").st_uid
            except OSError:
                continue
            if lo <= uid < hi:
                out.append(int(name))
    return out


@pytest.fixture(autouse=True)
def host_unharmed():
    assert _sandbox_pids() == []
    yield
    deadline = time.monotonic() + 3
    while _sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_pids() == [], "sandboxed processes survived the run"


def test_pass_fail_and_output():
    r = sandbox.run("print('hello'); import sys; print('err', file=sys.stderr)", **LIMITS)
    assert (r.status, r.returncode, r.stdout, r.stderr) == ("passed", 0, "hello\n", "err\n")
    r = sandbox.run("assert 1 + 1 == 3", **LIMITS)
    assert r.status == "failed" and r.returncode == 1 and "AssertionError" in r.stderr
    r = sandbox.run("import sys; sys.exit(7)", **LIMITS)
    assert (r.status, r.returncode) == ("failed", 7)
    r = sandbox.run("def f(:\n", **LIMITS)
    assert r.status == "failed" and "SyntaxError" in r.stderr


def test_killed_by_signal_is_crashed():
    r = sandbox.run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", **LIMITS)
    assert r.status == "crashed" and r.returncode == -signal.SIGSEGV


def test_bad_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        sandbox.run("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        sandbox.run("pass", memory_mb=1)
    with pytest.raises(TypeError, match="code"):
        sandbox.run(None)
    with pytest.raises(ValueError, match="max_program_bytes"):
        sandbox.run("pass", max_program_bytes=0)


def test_children_die_with_the_program():
    code = ("import os, time\n"
            "for _ in range(5):\n"
            "    if os.fork() == 0:\n"
            "        time.sleep(60); os._exit(0)\n"
            "print('spawned')\n")
    r = sandbox.run(code, **LIMITS)
    assert r.status == "passed" and r.stdout == "spawned\n"
    # host_unharmed checks the five sleepers are gone.


def test_infinite_loop_ignoring_sigterm_times_out():
    code = ("import signal\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('looping', flush=True)\n"
            "while True:\n    pass\n")
    t0 = time.monotonic()
    r = sandbox.run(code, timeout_s=1.0, memory_mb=256, max_processes=16)
    assert r.status == "timeout" and r.stdout == "looping\n"
    assert time.monotonic() - t0 < 10


def test_memory_bomb():
    r = sandbox.run("x = bytearray(1 << 30)\nprint('allocated')", **LIMITS)
    assert r.status in ("failed", "crashed") and "allocated" not in r.stdout
    # Processes that each stay under the per-process limit: the cgroup (where available) bounds
    # their sum, so at most one of four 192 MB children can finish its allocation.
    code = ("import os\n"
            "kids = []\n"
            "for _ in range(4):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        blocks = [b'\\x01' * (16 << 20) for _ in range(12)]\n"
            "        __import__('time').sleep(0.5)\n"
            "        os._exit(0)\n"
            "    kids.append(pid)\n"
            "ok = sum(os.waitpid(k, 0)[1] == 0 for k in kids)\n"
            "print('ok', ok)\n")
    # ~2.5 s on a loaded 2-core host (reclaim at the cgroup limit): a wider wall-clock limit.
    r = sandbox.run(code, timeout_s=10.0, memory_mb=256, max_processes=16)
    if not sandbox.capabilities()["cgroup"]:
        pytest.skip("no cgroup: only per-process memory limits")
    assert r.stdout in ("ok 0\n", "ok 1\n") or r.status == "crashed", (r.stdout, r.status)


def test_fork_bomb():
    code = ("import os\n"
            "while True:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        pass\n")
    r = sandbox.run(code, timeout_s=2.0, memory_mb=256, max_processes=16)
    assert r.status in ("timeout", "failed", "crashed")


def test_double_forked_daemon_does_not_survive():
    code = ("import os, signal, time\n"
            "r, w = os.pipe()\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "        signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            "        os.write(w, b'up')\n"
            "        time.sleep(120)\n"
            "    os._exit(0)\n"
            "print('daemon', os.read(r, 2).decode())\n")
    r = sandbox.run(code, **LIMITS)
    assert r.status == "passed" and r.stdout == "daemon up\n"
    # host_unharmed asserts that no process of a sandbox uid remains.


def test_cannot_write_outside_its_directory(tmp_path):
    name = f"jaxsocial-sandbox-escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}",
               os.path.join(os.getcwd(), name), str(tmp_path / name), f"/{name}"]
    code = ("import os\n"
            f"targets = {targets!r}\n"
            "wrote = []\n"
            "for t in targets:\n"
            "    try:\n"
            "        with open(t, 'w') as f:\n"
            "            f.write('pwned')\n"
            "        wrote.append(t)\n"
            "    except OSError:\n"
            "        pass\n"
            "open('inside.txt', 'w').write('ok')\n"
            "print(os.getcwd())\n")
    r = sandbox.run(code, **LIMITS)
    assert r.status == "passed", r.stderr
    for t in targets:
        assert not os.path.exists(t), f"sandbox wrote {t} on the host"
    # The working directory the program saw is gone too (its tmpfs or temp dir was removed).
    assert not os.path.exists(os.path.join(r.stdout.strip(), "inside.txt"))


def test_file_size_limit():
    r = sandbox.run("open('big', 'wb').write(b'x' * (8 << 20))", timeout_s=3.0, memory_mb=256,
                    max_processes=16, max_file_mb=1)
    assert r.status in ("failed", "crashed")


def test_cannot_read_the_callers_environment(monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("JAXSOCIAL_TEST_SECRET", secret)
    code = ("import os\n"
            "found = [v for v in os.environ.values()]\n"
            "for pid in [p for p in os.listdir('/proc') if p.isdigit()] + "
            f"['{os.getpid()}', 'self', '1']:\n"
            "    try:\n"
            "        found.append(open(f'/proc/{pid}/environ', 'rb').read().decode('latin1'))\n"
            "    except OSError:\n"
            "        pass\n"
            "print('\\n'.join(found))\n")
    r = sandbox.run(code, **LIMITS)
    assert r.status == "passed"
    assert secret not in r.stdout and "JAXSOCIAL_TEST_SECRET" not in r.stdout
    assert "PATH" in r.stdout  # the minimal environment it does get


def test_cannot_signal_the_caller():
    victim = subprocess.Popen(["sleep", "30"])
    try:
        code = ("import os, signal\n"
                "hits = 0\n"
                f"for pid in ({os.getpid()}, {victim.pid}, os.getppid(), 1):\n"
                "    try:\n"
                "        os.kill(pid, signal.SIGKILL); hits += 1\n"
                "    except OSError:\n"
                "        pass\n"
                "try:\n"
                "    os.kill(-1, signal.SIGKILL)\n"
                "except OSError:\n"
                "    pass\n"
                "print('hits', hits)\n")
        r = sandbox.run(code, **LIMITS)
        assert victim.poll() is None, "sandbox killed a host process"
        assert r.status in ("passed", "crashed")  # kill(-1) may take the program itself down
        assert "hits 0" in r.stdout or r.stdout == ""
    finally:
        victim.kill()
        victim.wait()


def test_no_network():
    code = ("import socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
            "s.settimeout(1)\n"
            "s.connect(('1.1.1.1', 80))\n"
            "print('connected')\n")
    r = sandbox.run(code, **LIMITS)
    if not sandbox.capabilities()["namespaces"]:
        pytest.skip("no network namespace on this host")
    assert r.status == "failed" and "connected" not in r.stdout
    assert "OSError" in r.stderr or "unreachable" in r.stderr


def test_huge_output_is_capped():
    r = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
                    timeout_s=3.0, memory_mb=256, max_processes=16, max_output_bytes=10_000)
    assert r.truncated and len(r.stdout) == 10_000 and r.status == "failed"


def test_run_many_keeps_going_and_keeps_order():
    codes = ["print(1)", "while True: pass", "import sys; sys.exit(2)", "print(4)"]
    rs = sandbox.run_many(codes, timeout_s=1.0, memory_mb=256, max_processes=16)
    assert [r.status for r in rs] == ["passed", "timeout", "failed", "passed"]
    assert rs[3].stdout == "4\n"


def test_result_channel_is_fd_3_and_apart_from_stdout():
    code = "import os\nprint('out')\nos.write(3, b'[1, 2]')\nos.write(3, b' ')\n"
    r = sandbox.run(code, result_channel=True, **LIMITS)
    assert (r.status, r.stdout, r.channel) == ("passed", "out\n", b"[1, 2] ")
    # Without a channel, fd 3 is closed in the program and nothing comes back.
    r = sandbox.run(code, **LIMITS)
    assert r.status == "failed" and "Bad file descriptor" in r.stderr and r.channel is None
    # A program that never writes it returns an empty channel, however it exits.
    r = sandbox.run("import os\nos._exit(0)", result_channel=True, **LIMITS)
    assert (r.status, r.channel) == ("passed", b"")


def _world_readable_host_file(directory):
    fd, path = tempfile.mkstemp(prefix="jaxsocial-sandbox-secret-", dir=directory)
    os.write(fd, b"secret")
    os.close(fd)
    os.chmod(path, 0o644)
    return path


@pytest.mark.parametrize("pivot", [True, False], ids=["pivot_root", "chroot"])
def test_filesystem_shows_only_the_interpreter(monkeypatch, pivot):
    if sandbox.capabilities()["view"] is None:
        pytest.skip("no private filesystem view on this host")
    if not pivot:  # the fallback where pivot_root is unavailable
        monkeypatch.setattr(sandbox, "_PIVOT_ROOT_NR", {})
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(sandbox.__file__)))
    host_tmp = _world_readable_host_file("/tmp")
    try:
        hidden = [os.path.join(checkout, "jaxsocial", "train", "code_problems.py"),
                  os.path.abspath(sandbox.__file__), checkout, host_tmp, "/etc/passwd", "/var",
                  "/bin/sh", "/proc/1/root" + os.path.abspath(sandbox.__file__),
                  "/proc/self/root" + os.path.abspath(sandbox.__file__)]
        # Home directories too, unless the interpreter itself lives in one.
        shown = [op[1] for op in sandbox.capabilities()["view"]]
        hidden += [d for d in ("/root", "/home", os.path.expanduser("~"), "/usr/local")
                   if d != "/" and not any(p.startswith(d + "/") for p in shown)]
        code = ("import collections, decimal, hashlib, json, math, os, re, sys\n"
                f"hidden = {hidden!r}\n"
                "print(json.dumps([p for p in hidden if os.path.exists(p)]))\n"
                "print(sorted(os.listdir('/')))\n"
                "try:\n"
                "    open(os.path.join(os.path.dirname(os.__file__), 'x.py'), 'w')\n"
                "    print('wrote the stdlib')\n"
                "except OSError:\n"
                "    print('stdlib read-only')\n"
                "print([p for p in sys.path if 'packages' in p and os.listdir(p)])\n")
        r = sandbox.run(code, **LIMITS)
    finally:
        os.remove(host_tmp)
    assert r.status == "passed", r.stderr
    found, top, write, site = r.stdout.splitlines()
    assert found == "[]"
    tops = {"dev", "proc", "tmp"} | {op[1].split("/")[1] for op in sandbox.capabilities()["view"]}
    assert "tmp" in eval(top) and set(eval(top)) <= tops, top  # noqa: S307 (our own output)
    assert write == "stdlib read-only"
    assert site == "[]"  # site-packages (this project, if installed) are empty


def test_without_the_view_the_host_files_are_visible(monkeypatch):
    # Negative control for the test above: the same probe sees the checkout with no view.
    if not sandbox.capabilities()["namespaces"]:
        pytest.skip("no namespaces on this host")
    monkeypatch.setitem(sandbox.capabilities(), "view", None)
    path = os.path.abspath(sandbox.__file__)
    if not all(os.stat(p).st_mode & 0o005 for p in (path, os.path.dirname(path))):
        pytest.skip("the checkout is not world-readable here")
    if any(path.startswith(d + os.sep) for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")):
        pytest.skip("the checkout is under /tmp, which the sandbox always replaces by a tmpfs")
    r = sandbox.run(f"print(len(open({path!r}).read()) > 0)", **LIMITS)
    assert (r.status, r.stdout) == ("passed", "True\n")


def test_view_plan_binds_read_only_and_hides(tmp_path):
    """The init's filesystem view, as the operations it performs (no privileges needed)."""
    from jaxsocial.eval import sandbox_init as si
    d, f = tmp_path / "lib", tmp_path / "python"
    d.mkdir()
    f.write_text("")
    view = [("bind", str(d)), ("bind", str(f)), ("dev", "/dev/null"),
            ("link", "/usr/bin/python3", str(f)), ("hide", "/etc")]
    ops = si.view_plan(view, tmpfs_kb=2048, new="/new")
    mounts = [o for o in ops if o[0] == "mount"]
    assert mounts[0][2] == "/new" and mounts[0][3] == b"tmpfs"          # the new root first
    assert mounts[-1] == ("mount", None, "/new", None,
                          si.MS_REMOUNT | si.MS_RDONLY | si.MS_NOSUID | si.MS_NODEV, None)
    for src, nodev in ((str(d), True), (str(f), True), ("/dev/null", False)):
        i = ops.index(("mount", src.encode(), "/new" + src, None, si.MS_BIND, None))
        remount = ops[i + 1]  # every bind is made read-only and nosuid right away
        assert remount[:3] == ("mount", None, "/new" + src)
        assert remount[4] & si.MS_RDONLY and remount[4] & si.MS_NOSUID
        assert bool(remount[4] & si.MS_NODEV) == nodev                 # devices stay usable
    assert ("touch", "/new" + str(f)) in ops and ("mkdir", "/new" + str(d)) in ops
    assert ("symlink", str(f), "/new/usr/bin/python3") in ops
    assert ("mount", b"tmpfs", "/new/etc", b"tmpfs",
            si.MS_RDONLY | si.MS_NOSUID | si.MS_NODEV | si.MS_NOEXEC, b"size=4k,mode=755") in ops
    for d_ in ("/tmp", "/dev/shm"):
        assert ("mount", b"tmpfs", "/new" + d_, b"tmpfs", si.MS_NOSUID | si.MS_NODEV,
                b"size=2048k,mode=1777") in ops
    # Room for the program on /tmp, where it is written; /dev/shm keeps the program's share.
    ops = si.view_plan(view, tmpfs_kb=2048, new="/new", program_kb=100)
    assert ("mount", b"tmpfs", "/new/tmp", b"tmpfs", si.MS_NOSUID | si.MS_NODEV,
            b"size=2148k,mode=1777") in ops
    assert ("mount", b"tmpfs", "/new/dev/shm", b"tmpfs", si.MS_NOSUID | si.MS_NODEV,
            b"size=2048k,mode=1777") in ops
    with pytest.raises(si.Failed, match="unknown view entry"):
        si.view_plan([("copy", "/x")], tmpfs_kb=1)


def test_init_source_is_the_module():
    """What runs in the child is the linted module's text, and it imports nothing of ours."""
    from jaxsocial.eval import sandbox_init
    with open(sandbox_init.__file__, encoding="utf-8") as fh:
        assert sandbox._INIT_SOURCE == fh.read()
    assert "jaxsocial" not in "".join(line for line in sandbox._INIT_SOURCE.splitlines()
                                      if line.startswith(("import", "from")))


def test_init_command_line_reveals_nothing_of_the_host(monkeypatch):
    """What the program can read of its init (PID 1, its parent) holds no host pid, run uid,
    cgroup path or the caller's interpreter / virtualenv / checkout path."""
    if not sandbox.capabilities()["namespaces"]:
        pytest.skip("no PID namespace: the program sees the host's /proc")
    cfgs = []
    real_input = sandbox._init_input
    monkeypatch.setattr(sandbox, "_init_input", lambda cfg, data: (cfgs.append(cfg),
                                                                   real_input(cfg, data))[1])
    code = ("import json, os\n"
            "out = {}\n"
            "for p in ['/proc/1/cmdline', '/proc/1/environ', '/proc/1/cgroup',\n"
            "          f'/proc/{os.getppid()}/cmdline', f'/proc/{os.getppid()}/environ',\n"
            "          '/proc/self/cgroup']:\n"
            "    try:\n"
            "        out[p] = open(p, 'rb').read().decode('latin1')\n"
            "    except OSError as e:\n"
            "        out[p] = type(e).__name__\n"
            "print(json.dumps(out))\n")
    r = sandbox.run(code, **LIMITS)
    assert r.status == "passed", r.stderr
    seen = json.loads(r.stdout)
    assert "-I" in seen["/proc/1/cmdline"]  # it was read: the init's command line
    (cfg,) = cfgs
    # Negative control: the configuration the host built holds each of these.
    built = json.dumps(cfg)
    markers = [str(cfg["uid"]), '"host_pid"', "status_fd"]
    # The run's cgroups, by name (as /proc/*/cgroup would show them; none without cgroups).
    markers += [os.path.basename(os.path.dirname(p)) for p in cfg["cgroup_procs"]]
    assert all(m in built for m in markers) and str(os.getpid()) in built
    # Host paths of this process: its interpreter and virtualenv (unless the program's view
    # binds them, as it does the interpreter it runs with), the checkout.
    shown = [op[1] for op in sandbox.capabilities()["view"] or []] + [cfg["python"]]
    host = [sys.executable, sys.prefix,
            os.path.dirname(os.path.dirname(os.path.abspath(sandbox.__file__)))]
    markers += [p for p in host if p != "/" and not any(v.startswith(p) for v in shown)]
    text = "\n".join(seen.values())
    assert [m for m in markers if m in text] == []
    # The host pid, as a number of its own (v1 cgroup lines start with small ids; the
    # interpreter's path has digits of its own).
    for p in ("/proc/1/cmdline", "/proc/1/environ"):
        assert not re.search(rf"(?<!\d){os.getpid()}(?!\d)", seen[p].replace(cfg["python"], ""))
    # With a cgroup namespace the program's cgroups are its root, not host paths.
    cgroups = [ln.split(":", 2)[2] for ln in seen["/proc/self/cgroup"].splitlines()]
    assert set(cgroups) == {"/"}, seen["/proc/self/cgroup"]


def _dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_leftover_cgroups_are_those_of_dead_hosts(tmp_path):
    """The selection, on a tree shaped like the cgroup filesystem (no privileges needed)."""
    live, dead, old = os.getpid(), 4_000_001, time.time() - 3600
    for layout in ({"memory": str(tmp_path / "memory"), "pids": str(tmp_path / "pids")},
                   {"v2": str(tmp_path / "v2")}):
        made = {}
        for root in layout.values():
            for key, name, procs, age in (
                    ("dead", f"jaxsocial-sandbox-{dead}-1783627777", "", old),
                    ("legacy", "jaxsocial-sandbox-1783627778", "", old),
                    ("live", f"jaxsocial-sandbox-{live}-1783627779", "", old),
                    ("busy", f"jaxsocial-sandbox-{dead}-1783627780", "1234\n", old),
                    ("young", f"jaxsocial-sandbox-{dead}-1783627781", "", time.time()),
                    ("other", "jaxsocial-sandbox-escape-1", "", old),
                    ("unrelated", "user.slice", "", old)):
                d = os.path.join(root, name)
                os.makedirs(d)
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(procs)
                os.utime(d, (age, age))
                made.setdefault(key, []).append(d)
        got = sandbox._leftover_cgroups(layout, pid_alive=lambda pid: pid == live)
        assert sorted(got) == sorted(made["dead"] + made["legacy"])
        # Every owner alive: only the legacy (ownerless) ones.
        got = sandbox._leftover_cgroups(layout, pid_alive=lambda pid: True)
        assert sorted(got) == sorted(made["legacy"])
    assert sandbox._pid_alive(os.getpid()) and not sandbox._pid_alive(10 ** 20)


def test_leftover_cgroups_are_removed_at_start_up(monkeypatch):
    """Real cgroups: a dead host's empty ones go at the first capabilities(); a live host's,
    or one still holding a process, stay."""
    roots = sandbox.capabilities()["cgroup"]
    if not roots:
        pytest.skip("no writable cgroup here")
    uid = sandbox._UID_BASE + sandbox._UID_SPAN - 1  # never allocated to a run of this test
    dead = _dead_pid()
    if sandbox._pid_alive(dead):
        pytest.skip("the dead pid was reused")
    names = {"dead": f"jaxsocial-sandbox-{dead}-{uid}", "live": f"jaxsocial-sandbox-"
             f"{os.getpid()}-{uid}", "busy": f"jaxsocial-sandbox-{dead}-{uid - 1}"}
    dirs = {k: [os.path.join(r, n) for r in dict.fromkeys(roots.values())]
            for k, n in names.items()}
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        old = time.time() - 3600
        for d in sum(dirs.values(), []):
            os.mkdir(d)
            os.utime(d, (old, old))
        for d in dirs["busy"]:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(sleeper.pid))
        # A fresh start-up, without the (slower) namespace and view probes.
        monkeypatch.setattr(sandbox, "_caps", None)
        monkeypatch.setattr(sandbox, "_warned", set())
        monkeypatch.setattr(sandbox, "_probe_namespaces", lambda: False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sandbox.capabilities()
        assert [d for d in dirs["dead"] if os.path.exists(d)] == []
        assert all(os.path.isdir(d) for d in dirs["live"] + dirs["busy"])
    finally:
        sleeper.kill()
        sleeper.wait()
        sandbox._remove_cgroups(sum(dirs.values(), []))


def test_program_size_limit():
    r = sandbox.run("#" * 1001, max_program_bytes=1000, result_channel=True, **LIMITS)
    assert (r.status, r.returncode, r.stdout, r.channel) == ("failed", None, "", b"")
    assert r.reason == ("the program is 1001 bytes, over the limit of 1000 bytes "
                        "(max_program_bytes); not run")
    # Just under the limit, and larger than the room the program may use for files (2 *
    # max_file_mb): its tmpfs is sized to hold it.
    code = "print('ran')\n#" + "#" * (3 << 20)
    r = sandbox.run(code, max_file_mb=1, max_program_bytes=len(code), **LIMITS)
    assert (r.status, r.stdout) == ("passed", "ran\n"), (r.reason, r.stderr[-500:])


def test_no_space_for_the_program_is_reported(monkeypatch):
    if not sandbox.capabilities()["namespaces"]:
        pytest.skip("no namespaces: the program is written to a host directory, not a tmpfs")
    monkeypatch.setattr(sandbox, "_program_kb", lambda nbytes: 0)  # no room made for it
    code = "#" * (3 << 20)
    r = sandbox.run(code, max_file_mb=1, **LIMITS)
    assert (r.status, r.reason) == (
        "crashed", f"sandbox setup failed: no space for the program ({3 << 20} bytes)")


def test_init_dying_without_a_status_is_reported(monkeypatch):
    caps = sandbox.capabilities()  # probed before _init_input is broken below
    real_input = sandbox._init_input
    # A configuration line the init cannot parse: it dies before any status line.
    monkeypatch.setattr(sandbox, "_init_input", lambda cfg, data: b"%d\n%s{\n" % (
        len(sandbox._INIT_SOURCE.encode()), sandbox._INIT_SOURCE.encode()))
    r = sandbox.run("print('ran')", **LIMITS)
    assert (r.status, r.stdout) == ("crashed", "")
    assert r.reason == "sandbox exited without a status: the init exited with code 1, see stderr"
    assert "JSONDecodeError" in r.stderr and 'File "sandbox_init.py"' in r.stderr
    # PID 1 failing (a malformed view entry): stage 1, the host's child, exits as it did.
    if caps["view"] is None:
        pytest.skip("no filesystem view: the init has no view entry to fail on")
    monkeypatch.setattr(sandbox, "_init_input",
                        lambda cfg, data: real_input(dict(cfg, view=[["bind"]]), data))
    r = sandbox.run("print('ran')", **LIMITS)
    assert r.reason == "sandbox exited without a status: the init exited with code 1, see stderr"
    assert "IndexError" in r.stderr
