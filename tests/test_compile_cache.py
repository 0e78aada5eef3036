"""JAX's persistent compilation cache (jaxsocial.compile_cache): where it lives, how it is
turned off, and that a run loading its programs from it is the same run.

The end-to-end test runs `launch/train.py --config=configs/demo.py:smoke` three times on one
fresh cache: the first compiles and writes entries, the second (the same config) writes none and
gives a bit-identical metrics.jsonl, the third (a changed shape) writes new entries.
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


def _train(workdir, cache, *overrides):
    env = dict(ONE_DEVICE_ENV, JAXSOCIAL_COMPILE_CACHE=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    out = subprocess.run(
        [sys.executable, "launch/train.py", "--config=configs/demo.py:smoke", "--noprogress",
         f"--workdir={workdir}", *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_a_cached_program_gives_the_same_run_and_a_changed_config_misses(tmp_path):
    cache = tmp_path / "xla"
    first = _train(tmp_path / "a", cache)
    written = _entries(cache)
    assert written, "the first run wrote no cache entry"
    # The same config: every program comes from the cache (nothing new written) ...
    second = _train(tmp_path / "b", cache)
    assert _entries(cache) == written
    # ... and the same numbers, bit for bit, of an epoch that learned something.
    assert first[0]["ppo"]["grad_norm"] > 0
    # Timings (wall_s, rollout_s, tokens_per_s, ...) differ; nothing else may.
    same = lambda rows: [{k: v for k, v in r.items() if not k.endswith("_s")}  # noqa: E731
                         for r in rows]
    assert same(first) == same(second)
    # A changed shape is another program: new entries (the control for "nothing new written").
    _train(tmp_path / "c", cache, "--config.agents.num_agents=4")
    assert _entries(cache) > written


def test_off_writes_nothing(tmp_path):
    code = ("import jax, jax.numpy as jnp\n"
            "from jaxsocial import compile_cache\n"
            "assert compile_cache.enable() is None\n"
            "jax.jit(lambda x: jnp.sin(x) @ x)(jnp.ones((64, 64))).block_until_ready()\n")
    env = dict(ONE_DEVICE_ENV, JAXSOCIAL_COMPILE_CACHE="off", JAXSOCIAL_CACHE=str(tmp_path),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    assert not os.path.exists(tmp_path / "xla")
    # The control: the same program with the cache on writes an entry.
    env[compile_cache.ENV] = str(tmp_path / "on")
    subprocess.run([sys.executable, "-c", code.replace("is None", "is not None")], cwd=ROOT,
                   env=env, check=True)
    assert _entries(tmp_path / "on")
