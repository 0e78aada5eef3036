"""JAX's persistent compilation cache, on by default for runs, studies and tests.

Every compiled program (the rollout, the update, the fused epoch, the embedding passes) is
written to disk keyed by JAX itself on the program's HLO, the compile options (XLA flags,
device assignment) and the jax/jaxlib version; a later process that builds the same program
loads it instead of compiling. A study's runs, a rerun of a config and pytest's workers reuse
each other's programs. A changed config or code changes the HLO, so it misses; a hit is the
same executable, so it gives the same numbers.

Where: `$JAXSOCIAL_COMPILE_CACHE` if set (a directory; `off` (or `0`, empty) turns the cache
off), else JAX's own `JAX_COMPILATION_CACHE_DIR` if set, else `<model cache>/xla` (the model
cache is `$JAXSOCIAL_CACHE`, default `~/.cache/jaxsocial`). The cache keeps at most `MAX_BYTES`
(least recently used entries go first); with a size bound JAX guards every read and write with a
file lock, so concurrent processes never see a half-written entry.

Programs that call back into Python (`jax.pure_callback`: the MiniLM retokenizer inside a rollout)
are never cached: JAX does not serialise host callbacks.
"""
from __future__ import annotations

import os
from typing import Optional

ENV = "JAXSOCIAL_COMPILE_CACHE"
OFF = ("", "0", "off", "false", "no", "none")
MAX_BYTES = 4 << 30


def directory() -> Optional[str]:
    """The cache directory this process would use (None: off). See the module docstring."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else os.path.abspath(
            os.path.expanduser(value))
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    from jaxsocial.models import zoo
    return os.path.join(zoo.cache_dir(), "xla")


def enable(path: Optional[str] = None) -> Optional[str]:
    """Turn the persistent cache on at `path` (None: `directory()`), or off where that says
    off. Call before the first compile. Returns the directory in use, or None. Which programs
    are worth an entry is JAX's `jax_persistent_cache_min_compile_time_secs` (default 1 s;
    env `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`)."""
    import jax

    path = directory() if path is None else path
    if path is None:
        disable()
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        # A cache is an optimisation: an unwritable place leaves the run uncached, not failed.
        import logging
        logging.getLogger(__name__).warning(
            "compile cache off: cannot create %s (%s); set %s to a writable directory or 'off'",
            path, e.strerror or e, ENV)
        disable()
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return path


def disable() -> None:
    """No persistent cache in this process (what a compile-time benchmark needs)."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
