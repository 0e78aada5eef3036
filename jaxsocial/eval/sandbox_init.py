"""The sandbox's init: the child program `sandbox.run` starts, as
``PYTHON -I -S -c BOOTSTRAP`` (PYTHON: the interpreter the program runs with, whose path the
program sees anyway; BOOTSTRAP: `sandbox._BOOTSTRAP`, which compiles this file's source from
stdin). Its stdin carries, in order: the length of this source and the source, the
configuration as one JSON line, then the untrusted code. So nothing of the host (its pid, the
run's uid and cgroups, the caller's interpreter or checkout) is on the command line, which the
program could read in /proc/1/cmdline.

Stage 1 joins the cgroup, unshares the namespaces and forks stage 2 (PID 1 of the new PID
namespace), which mounts /proc and the tmpfs (or builds the whole filesystem view and pivots
into it), writes the program and forks it with dropped privileges and rlimits. Each stage dies
with its parent (PR_SET_PDEATHSIG), so a killed host or a killed stage 1 takes the whole tree
down. Status lines go to the host on `cfg["status_fd"]`: "started", then "exit N" / "signal N",
or "error MSG".

Standard library only, and nothing imported from jaxsocial: it runs isolated (-I -S), from its
source text. `view_plan` (the filesystem view as a list of operations) is pure and unit-tested.
"""
import ctypes
import errno
import json
import os
import resource
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
MNT_DETACH = 2
CLONE_NEWCGROUP = 0x02000000
ROOT = "/tmp"  # the new root's mount point (this namespace's /tmp) while the view is built
WORKDIR = "/tmp/sandbox"


class Failed(Exception):
    """A set-up step failed; the message goes to the host as "error MSG"."""


def view_plan(view, tmpfs_kb: int, new: str = ROOT, program_kb: int = 0) -> list:
    """The operations that build the sandbox's filesystem under `new`, in order.

    view: ("bind", path) read-only bind of a host file or directory, ("dev", path) the same for
    a device node (devices stay usable: no MS_NODEV), ("link", path, target) a symlink,
    ("hide", path) an empty read-only tmpfs over a path. Returns tuples ("mkdir", path),
    ("touch", path), ("symlink", target, path) and ("mount", src, dst, fstype, flags, data) with
    bytes src / fstype / data. A new root on a small tmpfs holds only these, private tmpfs for
    /tmp (`tmpfs_kb` + `program_kb`: the program is written there) and /dev/shm (`tmpfs_kb`),
    a fresh /proc and the /dev/fd links; the root is then remounted read-only. Raises Failed
    for an unknown entry.
    """
    ops = [("mount", b"tmpfs", new, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1024k,mode=755")]
    for op in view:
        kind, path = op[0], new + op[1]
        if kind in ("bind", "dev"):
            if os.path.isdir(op[1]):
                ops.append(("mkdir", path))
            else:
                ops += [("mkdir", os.path.dirname(path)), ("touch", path)]
            ops.append(("mount", op[1].encode(), path, None, MS_BIND, None))
            ops.append(("mount", None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID
                        | (0 if kind == "dev" else MS_NODEV), None))
        elif kind == "link":
            ops += [("mkdir", os.path.dirname(path)), ("symlink", op[2], path)]
        elif kind == "hide":
            ops.append(("mount", b"tmpfs", path, b"tmpfs",
                        MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k,mode=755"))
        else:
            raise Failed("unknown view entry %r" % (op,))
    ops += [("mkdir", new + d) for d in ("/tmp", "/dev/shm", "/proc")]
    ops += [("mount", b"tmpfs", new + d, b"tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts(kb))
            for d, kb in (("/tmp", tmpfs_kb + program_kb), ("/dev/shm", tmpfs_kb))]
    ops.append(("mount", b"proc", new + "/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                None))
    ops += [("symlink", target, new + "/dev/" + name)
            for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                                 ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))]
    ops.append(("mount", None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None))
    return ops


def tmpfs_opts(kb: int) -> bytes:
    return ("size=%dk,mode=1777" % kb).encode()


class Init:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                    ctypes.c_ulong, ctypes.c_char_p]

    def die_with_parent(self, parent: int) -> None:
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(70)

    def mount(self, src, dst: str, fstype, flags: int, data=None) -> None:
        if self.libc.mount(src, dst.encode(), fstype, flags, data) != 0:
            raise Failed("mounting %s failed: errno %d" % (dst, ctypes.get_errno()))

    def run_plan(self, ops) -> None:
        for op in ops:
            if op[0] == "mkdir":
                os.makedirs(op[1], 0o755, exist_ok=True)
            elif op[0] == "touch":
                os.close(os.open(op[1], os.O_WRONLY | os.O_CREAT, 0o644))
            elif op[0] == "symlink":
                os.symlink(op[1], op[2])
            else:
                self.mount(*op[1:])

    def stage1(self) -> None:
        """Join the cgroups, unshare, fork PID 1; stage 1 itself waits for it and exits."""
        cfg = self.cfg
        for procs in cfg["cgroup_procs"]:
            try:
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
            except OSError as e:
                raise Failed("joining the cgroup %s failed: %s" % (os.path.dirname(procs), e))
        if cfg["namespaces"]:
            if self.libc.unshare(cfg["ns_flags"]) != 0:
                raise Failed("unshare failed: errno %d" % ctypes.get_errno())
            # A cgroup namespace rooted at the run's cgroup, so that /proc/*/cgroup inside shows
            # "/" rather than the host's cgroup paths. Kernels before 4.6 lack it (EINVAL):
            # those paths then stay readable, nothing else changes.
            self.libc.unshare(CLONE_NEWCGROUP)
        stage1 = os.getpid()
        init = os.fork()
        if init:
            if cfg["channel_fd"] is not None:
                os.close(cfg["channel_fd"])
            try:  # pass on how PID 1 ended (the host reports it when no status line came)
                st = os.waitpid(init, 0)[1]
            except ChildProcessError:
                st = 0
            os._exit(os.WEXITSTATUS(st) if os.WIFEXITED(st) else 128 + os.WTERMSIG(st))
        # The parent of PID 1 lives outside the new PID namespace, where getppid() reads 0.
        self.die_with_parent(0 if cfg["namespaces"] else stage1)

    def filesystem(self) -> str:
        """Private mounts (or the whole view, pivoted into); -> the program's working dir."""
        cfg = self.cfg
        if not cfg["namespaces"]:
            return cfg["workdir"]
        # Private first: nothing mounted below may propagate back to the host's mount table.
        if self.libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            raise Failed("making / private failed: errno %d" % ctypes.get_errno())
        if cfg["view"] is None:
            self.mount(b"proc", "/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
                if os.path.isdir(d) and not os.path.islink(d):
                    kb = cfg["tmpfs_kb"] + (cfg["program_kb"] if d == "/tmp" else 0)
                    self.mount(b"tmpfs", d, b"tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts(kb))
        else:
            self.run_plan(view_plan(cfg["view"], cfg["tmpfs_kb"], program_kb=cfg["program_kb"]))
            os.chdir(ROOT)
            nr = cfg["pivot_root_nr"]
            if nr is not None and self.libc.syscall(nr, b".", b".") == 0:
                # The old root now lies under the new one at "."; detach it.
                if self.libc.umount2(b".", MNT_DETACH) != 0:
                    raise Failed("detaching the old root failed: errno %d" % ctypes.get_errno())
            else:  # e.g. an initramfs root: chroot, which the unprivileged uid cannot leave
                os.chroot(".")
            os.chdir("/")
        os.mkdir(WORKDIR, 0o700)
        return WORKDIR

    def exec_program(self, workdir: str) -> None:
        """In the forked child: fds, rlimits, uid, no_new_privs, then exec the program."""
        cfg = self.cfg
        try:
            os.setsid()
            devnull = os.open("/dev/null", os.O_RDONLY)
            os.dup2(devnull, 0)
            if cfg["channel_fd"] is not None:  # the result channel, on fd 3
                os.dup2(cfg["channel_fd"], 3)
                os.set_inheritable(3, True)
            os.closerange(3 if cfg["channel_fd"] is None else 4, 1 << 16)
            for name, value in cfg["rlimits"]:
                resource.setrlimit(getattr(resource, name), (value, value))
            if cfg["drop_uid"]:
                os.setgroups([])
                os.setgid(cfg["gid"])
                os.setuid(cfg["uid"])
            self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binaries
            os.chdir(workdir)
            env = dict(cfg["env"], HOME=workdir, TMPDIR=workdir)
            py = cfg["python"]
            os.execve(py, [py, "-I", "-B", "program.py"], env)
        except BaseException as e:
            os.write(2, ("[sandbox] could not start the program: %r\n" % (e,)).encode())
        os._exit(127)


def write_program(path: str, code: bytes) -> None:
    """Write the program; a full tmpfs (the host sizes it to fit) is an "error" status line."""
    try:
        with open(path, "wb") as f:
            f.write(code)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise Failed("no space for the program (%d bytes)" % len(code)) from None
        raise Failed("writing the program (%d bytes) failed: %s" % (len(code), e)) from None


def main(stdin) -> None:
    """`stdin`: the binary stream after the source (the bootstrap read that part)."""
    cfg = json.loads(stdin.readline())
    status = os.fdopen(cfg["status_fd"], "w", buffering=1)
    init = Init(cfg)
    try:
        init.die_with_parent(cfg["host_pid"])
        code = stdin.read()
        init.stage1()
        workdir = init.filesystem()
        if cfg["drop_uid"]:
            os.chown(workdir, cfg["uid"], cfg["gid"])
        prog = os.path.join(workdir, "program.py")
        write_program(prog, code)
        del code  # PID 1 lives as long as the program: do not keep a copy
        if cfg["drop_uid"]:
            os.chown(prog, cfg["uid"], cfg["gid"])
        status.write("started\n")
        child = os.fork()
        if child == 0:
            init.exec_program(workdir)
        if cfg["channel_fd"] is not None:  # only the program (and its children) may hold it
            os.close(cfg["channel_fd"])
        # PID 1 reaps every orphan until the program itself is done; returning kills the
        # namespace.
        while True:
            try:
                pid, st = os.waitpid(-1, 0)
            except ChildProcessError:
                raise Failed("program vanished") from None
            if pid == child:
                break
    except Failed as e:
        status.write("error " + str(e).replace("\n", " ") + "\n")
        os._exit(71)
    if os.WIFSIGNALED(st):
        status.write("signal %d\n" % os.WTERMSIG(st))
    else:
        status.write("exit %d\n" % os.WEXITSTATUS(st))
    status.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.stdin.buffer)
