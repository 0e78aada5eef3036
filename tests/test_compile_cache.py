"""JAX's persistent compilation cache (jaxsocial.compile_cache): where it lives, how it is
turned off, and that a run loading its programs from it is the same run.

The end-to-end test runs `launch/train.py --config=configs/demo.py:smoke` twice on one fresh
cache: the first compiles and writes every program, the second loads every one (JAX's own hit
and miss log lines), writes nothing and gives a bit-identical metrics.jsonl. A changed program
(code, or a config value traced into it) misses: checked on a small program.
"""
import json
import os
import subprocess
import sys

import pytest
from conftest import ONE_DEVICE_ENV, ROOT

from jaxsocial import compile_cache


def test_the_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "mine"))
    assert compile_cache.directory() == str(tmp_path / "mine")
    for off in ("off", "0", "", "none"):
        monkeypatch.setenv(compile_cache.ENV, off)
        assert compile_cache.directory() is None
    monkeypatch.delenv(compile_cache.ENV)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert compile_cache.directory() == str(tmp_path / "jax")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("JAXSOCIAL_CACHE", str(tmp_path / "models"))
    assert compile_cache.directory() == str(tmp_path / "models" / "xla")


def _entries(cache):
    return {f for f in os.listdir(cache) if f.endswith("-cache")} if os.path.isdir(cache) else set()


# Runs a script (argv[2:]) and, at exit, writes to the file argv[1] JAX's own counts of the
# compile requests that consulted the persistent cache and of those it answered
# (jax.monitoring events).
COUNTING = (
    "import atexit, collections, runpy, sys\n"
    "import jax.monitoring\n"
    "n = collections.Counter()\n"
    "jax.monitoring.register_event_listener(lambda event, **kw: n.update([event]))\n"
    "counts = sys.argv[1]\n"
    "atexit.register(lambda: open(counts, 'w').write('%d %d' % (\n"
    "    n['/jax/compilation_cache/compile_requests_use_cache'],\n"
    "    n['/jax/compilation_cache/cache_hits'])))\n"
    "sys.argv = sys.argv[2:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def _compile_log(cache, *argv):
    """(hits, misses) of JAX's persistent cache in `python argv...` on `cache` (every program's
    entry written: no minimum compile time)."""
    env = dict(ONE_DEVICE_ENV, JAXSOCIAL_COMPILE_CACHE=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    counts = f"{cache}.counts"
    out = subprocess.run([sys.executable, "-c", COUNTING, counts, *argv], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(counts) as f:
        requests, hits = map(int, f.read().split())
    return hits, requests - hits


def _train(workdir, cache):
    hits, misses = _compile_log(cache, "launch/train.py", "--config=configs/demo.py:smoke",
                                "--noprogress", f"--workdir={workdir}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], hits, misses


@pytest.mark.slow
def test_a_rerun_loads_every_program_and_gives_the_same_run(tmp_path):
    cache = tmp_path / "xla"
    first, hits1, misses1 = _train(tmp_path / "a", cache)
    written = _entries(cache)
    # The control: a cold cache compiles (misses) and writes every program.
    assert misses1 > 0 and hits1 == 0 and len(written) == misses1
    second, hits2, misses2 = _train(tmp_path / "b", cache)
    # The same config: every program loaded, none compiled, nothing new written ...
    assert (hits2, misses2) == (misses1, 0)
    assert _entries(cache) == written
    # ... and the same numbers, bit for bit, of an epoch that learned something.
    assert first[0]["ppo"]["grad_norm"] > 0
    # Timings (wall_s, rollout_s, tokens_per_s, ...) differ; nothing else may.
    same = lambda rows: [{k: v for k, v in r.items() if not k.endswith("_s")}  # noqa: E731
                         for r in rows]
    assert same(first) == same(second)


PROGRAM = ("import sys, jax, jax.numpy as jnp\n"
           "from jaxsocial import compile_cache\n"
           "assert compile_cache.enable() is not None\n"
           "f = lambda x: jnp.sin(x) @ x + float(sys.argv[1])\n"
           "jax.jit(f)(jnp.ones((64, 64))).block_until_ready()\n")


def test_the_same_program_hits_and_a_changed_one_misses(tmp_path):
    """Another process builds the same program: a hit; a changed constant (changed code, or a
    config value traced into the program): a miss and a new entry."""
    cache = tmp_path / "xla"
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    hits, misses = _compile_log(cache, str(program), "1")
    written = _entries(cache)
    assert hits == 0 and misses == len(written) > 0
    assert _compile_log(cache, str(program), "1") == (len(written), 0)
    hits, misses = _compile_log(cache, str(program), "2")
    assert misses > 0 and len(_entries(cache)) == len(written) + misses


def test_off_writes_nothing(tmp_path):
    code = PROGRAM.replace("is not None", "is None")
    env = dict(ONE_DEVICE_ENV, JAXSOCIAL_COMPILE_CACHE="off", JAXSOCIAL_CACHE=str(tmp_path),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    subprocess.run([sys.executable, "-c", code, "1"], cwd=ROOT, env=env, check=True)
    assert not os.path.exists(tmp_path / "xla")
    # The control: the same program with the cache on writes entries.
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    _compile_log(tmp_path / "on", str(program), "1")
    assert _entries(tmp_path / "on")
