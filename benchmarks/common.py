"""What every benchmark shares: the machine a figure was measured on, one line naming it, and
the result file that records a run (benchmarks/results/README.md).

    from common import finish          # benchmarks/ is on sys.path when a script runs
    ...
    finish("generate", {"ours_tok_s": 812.0, ...}, record=not args.no_record)

`finish` writes `benchmarks/results/<name>-<UTC date time>.json` (unless `--no_record` or the
environment variable JAXSOCIAL_NO_RECORD=1), prints `result: <path>`, then the machine line
as the run's last line:

    machine: cpu="AMD EPYC" cores=2 sgemm_gflops=49 backend=cpu device="cpu" load=3.66

Fair by default: a peer on PyTorch gets as many threads as JAX has cores
(`resolve_threads(0)`), and `thread_handicap` names a setting that gives it fewer.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time

# Before JAX's backend starts: with libtpu installed and no TPU, this package points JAX at
# the CPU, so libtpu's TPU-host errors never reach a benchmark's console.
import jaxsocial  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = "benchmarks/results"
NO_RECORD_ENV = "JAXSOCIAL_NO_RECORD"    # "1": no result file, whatever the flags say
RESULTS_ENV = "JAXSOCIAL_BENCH_RESULTS"  # another folder for the result files
NO_RECORD_HELP = (f"do not write the result file under {RESULTS_DIR}/ (also: "
                  f"{NO_RECORD_ENV}=1)")


# ----------------------------------------------------------------------------------------------
# the machine


def cpu_model() -> str:
    """The CPU's "model name" from /proc/cpuinfo, else `platform.processor()`, else ''."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or ""


def cores() -> int:
    """Logical cores this process may run on (its CPU affinity): what XLA's CPU thread pool
    uses, and what a PyTorch peer gets by default here."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def sgemm_gflops(n: int = 1024, repeats: int = 5) -> float:
    """float32 matmul GFLOP/s on JAX's default device, measured now: a jitted n x n x n product
    (2 n^3 FLOPs), best of `repeats` calls after a compile call. On a shared machine it drops
    with the load, which is what it is for: figures from two runs compare only beside it."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    jax.block_until_ready(mm(a))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(mm(a))
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def machine(sgemm_n: int = 1024) -> dict:
    """This machine as the figures saw it: CPU model, cores, JAX backend and device, the
    sgemm GFLOP/s measured in this process, the load, and PyTorch's threads if it is loaded."""
    import jax

    dev = jax.devices()[0]
    m = {
        "cpu": cpu_model(),
        "cores": cores(),
        "cpu_count": os.cpu_count(),
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "sgemm_gflops": round(sgemm_gflops(sgemm_n), 1),
        "sgemm_n": sgemm_n,
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "jax": jax.__version__,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        m["torch"] = torch.__version__
        m["torch_threads"] = torch.get_num_threads()
    return m


def machine_line(m: dict) -> str:
    """One line: `machine: cpu="..." cores=N sgemm_gflops=G backend=B ...`."""
    cpu = str(m.get("cpu", "")).replace('"', "'")
    line = (f'machine: cpu="{cpu}" cores={m.get("cores")} '
            f'sgemm_gflops={m.get("sgemm_gflops", 0):.0f} backend={m.get("backend")}')
    if m.get("device_kind") and m.get("device_kind") != m.get("backend"):
        line += f' device="{m["device_kind"]}" devices={m.get("device_count")}'
    if "torch_threads" in m:
        line += f" torch_threads={m['torch_threads']}"
    if m.get("load_avg_1m") is not None:
        line += f" load={m['load_avg_1m']:.2f}"
    return line


# ----------------------------------------------------------------------------------------------
# fairness


def resolve_threads(requested: int) -> int:
    """A peer's thread count: `requested`, or 0 -> as many as JAX has cores (`cores()`)."""
    return int(requested) if requested and requested > 0 else cores()


def thread_handicap(peer_threads: int, jax_cores: int | None = None) -> str | None:
    """None when the peer gets as many threads as JAX has cores, else a sentence saying how
    the peer is handicapped (for the printout and the result's figures)."""
    jax_cores = cores() if jax_cores is None else int(jax_cores)
    if int(peer_threads) >= jax_cores:
        return None
    return (f"UNFAIR: the peer gets {peer_threads} thread(s), JAX gets {jax_cores} core(s); "
            f"its figures are not comparable to ours")


# ----------------------------------------------------------------------------------------------
# the result file


def git_state(root: str = ROOT) -> tuple:
    """(commit, dirty): `git rev-parse HEAD` and whether tracked files differ from it;
    (None, None) where git or the repository is missing."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10)
        if commit.returncode != 0:
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=root, capture_output=True, text=True, timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return commit.stdout.strip() or None, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def command_line(argv=None) -> str:
    """The command as run, from the repository root: `python benchmarks/x.py --flag ...`."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        script = os.path.abspath(argv[0])
        if script.startswith(ROOT + os.sep):
            argv[0] = os.path.relpath(script, ROOT)
    return shlex.join(["python", *argv])


def _plain(x):
    """JSON-safe copy: numpy scalars / arrays to Python, non-finite floats to None."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        return _plain(x.tolist())
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, (bool, int, str)):
        return x
    return str(x)


def recording(no_record: bool = False) -> bool:
    """Whether a run writes its result file: not with `--no_record` nor JAXSOCIAL_NO_RECORD=1."""
    return not no_record and os.environ.get(NO_RECORD_ENV, "") in ("", "0")


def write_result(name: str, figures: dict, *, argv=None, directory: str | None = None,
                 machine_info: dict | None = None) -> str:
    """Write `<directory>/<name>-<UTC YYYYmmddTHHMMSSZ>.json` (README.md in that folder) and
    return its path. `directory` (default benchmarks/results, or $JAXSOCIAL_BENCH_RESULTS) is
    taken from the repository root when relative; `machine_info` defaults to `machine()`.
    A missing git gives "commit": null; nothing here fails the benchmark but an unwritable
    folder."""
    directory = directory or os.environ.get(RESULTS_ENV) or RESULTS_DIR
    if not os.path.isabs(directory):
        directory = os.path.join(ROOT, directory)
    os.makedirs(directory, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    commit, dirty = git_state()
    record = {
        "benchmark": name,
        "command": command_line(argv),
        "commit": commit,
        "dirty": dirty,
        "date": now.isoformat().replace("+00:00", "Z"),
        "machine": machine() if machine_info is None else machine_info,
        "figures": figures,
    }
    stem = os.path.join(directory, f"{name}-{now.strftime('%Y%m%dT%H%M%SZ')}")
    path, i = stem + ".json", 1
    while os.path.exists(path):  # two runs in one second
        i += 1
        path = f"{stem}-{i}.json"
    with open(path, "w") as f:
        json.dump(_plain(record), f, indent=2, allow_nan=False)
        f.write("\n")
    return path


def finish(name: str, figures: dict, *, record: bool = True, argv=None,
           directory: str | None = None) -> dict:
    """The end of a benchmark: measure the machine, write the result file (when `record` and
    not JAXSOCIAL_NO_RECORD=1) and print `result: <path>`, then the machine line, last."""
    m = machine()
    if recording(not record):
        path = write_result(name, figures, argv=argv, directory=directory, machine_info=m)
        print(f"result: {os.path.relpath(path, ROOT)}", flush=True)
    print(machine_line(m), flush=True)
    return m
