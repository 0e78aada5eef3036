"""Shared behaviour of the command-line entry points (launch/*.py)."""
from __future__ import annotations

import logging
import math
import sys

from absl import flags

HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def parse_flags(argv, compile_cache: bool = True):
    """absl's flag parser, except that asking for help exits 0 (absl exits 1 after printing
    the usage, which makes `--help` look like a failure to shells and CI), a bad flag is one
    line on stderr with exit status 2, and JAX's backend-probing INFO line is not shown. Then
    JAX's persistent compilation cache is turned on (`jaxsocial.compile_cache`; False: off, for
    a launcher that measures compile times)."""
    # JAX's "Unable to initialize backend 'tpu' ... libtpu.so" INFO line on every CPU/GPU
    # start says nothing the user asked about.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    try:
        rest = flags.FLAGS(argv)
    except SystemExit as e:
        if e.code and any(a in HELP_FLAGS for a in argv[1:]):
            raise SystemExit(0) from None
        raise
    except flags.Error as e:
        sys.stderr.write(f"error: {e} (see --help)\n")
        raise SystemExit(2) from None
    from jaxsocial import compile_cache as cache
    cache.enable() if compile_cache else cache.disable()
    return rest


def json_safe(x):
    """`x` with numpy scalars as Python numbers, tuples as lists and non-finite floats as None
    (strict JSON for results files)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if hasattr(x, "item") and getattr(x, "shape", None) == ():
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def env_params(cls, env_cfg, **overrides):
    """`cls(**env_cfg, **overrides).validate()` for a launcher config's `env` block (an
    EnvParams dataclass). ValueError in one line naming the field as its `--config.` key
    ("env.num_rounds must be >= 1, got 0"), or the unknown settings."""
    kw = dict(env_cfg.to_dict() if hasattr(env_cfg, "to_dict") else env_cfg)
    kw.update(overrides)
    fields = cls.__dataclass_fields__
    unknown = set(kw) - set(fields)
    if unknown:
        raise ValueError(f"unknown env settings {sorted(unknown)}")
    try:
        return cls(**kw).validate()
    except ValueError as e:  # "num_rounds must be >= 1, got 0" -> "env.num_rounds must ..."
        msg = str(e)
        first = msg.split(" ", 1)[0]
        raise ValueError(f"env.{msg}" if first in fields else f"env: {msg}") from None
