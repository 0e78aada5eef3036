"""Crowd-only society simulation: per-tick metrics as JSONL, a final summary.

    python launch/simulate.py --config=configs/million.py --workdir=runs/million
    python launch/simulate.py --config=configs/million.py:small --workdir=runs/small

Writes <workdir>/metrics.jsonl (one line per recorded tick: society metrics + seconds) and
<workdir>/summary.json (config, totals, seconds per tick, final metrics, peak RSS).
"""
import functools
import json
import os
import resource
import time

import jax
import numpy as np
import tqdm
from absl import app, flags, logging
from ml_collections import config_flags

from jaxsocial import cli
from jaxsocial.social import metrics, society

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/million.py[:variant]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory (metrics.jsonl, summary.json)")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def run(config, workdir: str, progress: bool = True) -> dict:
    """Simulate `config.ticks` crowd ticks; returns the summary dict (also written)."""
    if not workdir:
        raise ValueError(f"--workdir is required, got {workdir!r}")
    os.makedirs(workdir, exist_ok=True)
    params = society.make_params(**dict(config.society))
    key = jax.random.key(config.seed)
    t0 = time.perf_counter()
    state = society.reset(jax.random.fold_in(key, 0), params)
    jax.block_until_ready(state)
    reset_s = time.perf_counter() - t0

    @functools.partial(jax.jit, donate_argnums=1)
    def tick(k, s):
        s, info = society.step(k, s, None, params)
        return s, info, info.agent.type_counts + info.crowd.apply.type_counts

    measure = jax.jit(functools.partial(metrics.compute, params=params))

    totals = {}
    tick_seconds = []
    last = {}
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path, "w") as out:
        for t in tqdm.trange(config.ticks, desc="ticks", disable=not progress):
            start = time.perf_counter()
            state, info, counts = tick(jax.random.fold_in(key, t + 1), state)
            jax.block_until_ready(counts)
            tick_seconds.append(time.perf_counter() - start)
            for name, value in metrics.to_json({"action_counts": counts})[
                    "action_counts"].items():
                totals[name] = totals.get(name, 0) + value
            if (t + 1) % config.metrics_every == 0 or t + 1 == config.ticks:
                last = metrics.to_json(measure(state, info))
                last["seconds"] = tick_seconds[-1]
                out.write(json.dumps(last) + "\n")
                out.flush()
    steady = tick_seconds[1:] or tick_seconds
    summary = {
        "config": config.to_dict(),
        "ticks": config.ticks,
        "reset_seconds": reset_s,
        "first_tick_seconds": tick_seconds[0],  # includes compilation
        "seconds_per_tick": float(np.median(steady)),  # the step, without metrics
        "total_actions": totals,
        "final": last,
        "peak_rss_gb": peak_rss_gb(),
        "metrics_path": path,
    }
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/million.py:small")
    s = run(_CONFIG.value, _WORKDIR.value)
    f = s["final"]
    logging.info("done: %d ticks, %.3f s/tick, peak RSS %.2f GB", s["ticks"],
                 s["seconds_per_tick"], s["peak_rss_gb"])
    print(json.dumps({k: s[k] for k in ("ticks", "seconds_per_tick", "peak_rss_gb")}
                     | {k: f.get(k) for k in ("avg_likes_per_post", "zero_like_share",
                                              "positive_engagement_share", "likes_gini",
                                              "total_posts")}))


if __name__ == "__main__":
    flags.mark_flag_as_required("workdir")
    app.run(main, flags_parser=cli.parse_flags)
