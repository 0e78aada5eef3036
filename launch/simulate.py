"""Crowd-only society simulation: per-tick metrics as JSONL, a final summary.

    python launch/simulate.py --config=configs/million.py --workdir=runs/million
    python launch/simulate.py --config=configs/million.py:small --workdir=runs/small

Writes <workdir>/metrics.jsonl (one line per recorded tick: society metrics + seconds) and
<workdir>/summary.json (config, totals, seconds per tick, final metrics, peak RSS).

Hard limits, checked before anything is built or written (`check_config`; a bad value is one
line, `error: ...`, naming its `--config.` key and the allowed range, exit status 1):
- `society.num_users` from 2 to (2**31 - 1) // W, where W is the widest per-user buffer
  (8, or `max_following`, `max_muted`, `reaction_memory`, `seen_memory`, `embed_dim` if larger):
  user ids and every per-user buffer are indexed with int32. That is 268,435,455 users at
  W = 8 and 67,108,863 with configs/million.py's W = 32 (a limit of representation: memory
  grows with the user count and may run out first).
- post ids are int32 and never reused: `society.num_seed_posts` + `ticks` x
  `society.crowd_budget` (the most posts one tick can create) must stay below 2**31, and
  `society.post_capacity` x `society.content_len` (the token buffer) too.
- `ticks` and `metrics_every` are integers >= 1.
"""
import functools
import json
import os
import resource
import sys
import time

import jax
import numpy as np
import tqdm
from absl import app, flags, logging
from ml_collections import config_flags

from jaxsocial import cli
from jaxsocial.social import metrics, recsys, society
from jaxsocial.train import fit

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/million.py[:variant]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory (metrics.jsonl, summary.json)")


INT32_LIMIT = 2**31  # ids and buffer indices are int32: every count must stay below this
MIN_USER_WIDTH = 8  # SocialParams' own bound: num_users * 8 < 2**31


def peak_rss_gb() -> float:
    """Peak resident memory of this process in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def _count(value, key: str, lo: int) -> int:
    """`value` as an int >= lo, else ValueError naming `key` and the bound."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lo:
        return int(value)
    raise ValueError(f"{key}={value!r} must be an integer >= {lo}")


def check_config(config) -> society.SocialParams:
    """The run's `SocialParams`, after the hard limits of the module docstring: ValueError
    naming the first bad `--config.` key and its allowed range. Builds and writes nothing."""
    _count(config.get("ticks"), "ticks", 1)
    _count(config.get("metrics_every"), "metrics_every", 1)
    soc = dict(config.society)
    defaults = society.SocialParams()
    widths = {k: soc.get(k, getattr(defaults, k)) for k in (
        "max_following", "max_muted", "reaction_memory", "seen_memory", "embed_dim")}
    for k, v in widths.items():
        _count(v, f"society.{k}", 1)
    width = max([MIN_USER_WIDTH] + list(widths.values()))
    max_users = (INT32_LIMIT - 1) // width
    users = soc.get("num_users", defaults.num_users)
    if not (isinstance(users, (int, np.integer)) and 2 <= users <= max_users):
        raise ValueError(f"society.num_users={users!r} is out of range: allowed 2 to "
                         f"{max_users:,} (user ids and per-user buffers of width {width} are "
                         f"int32-indexed; see launch/simulate.py)")
    try:
        params = society.make_params(**soc)
    except ValueError as e:  # "invalid SocialParams.<field>=..." -> the config key
        raise ValueError(str(e).replace("invalid SocialParams.", "invalid society.")) from None
    ticks = int(config.ticks)
    last_id = params.num_seed_posts + ticks * (params.crowd_budget + params.num_agents)
    if last_id >= INT32_LIMIT:
        raise ValueError(f"ticks={ticks} x society.crowd_budget={params.crowd_budget} posts "
                         f"per tick (+ society.num_seed_posts={params.num_seed_posts}) can "
                         f"pass 2**31 post ids (int32): lower ticks or society.crowd_budget")
    if params.post_capacity * params.content_len >= INT32_LIMIT:
        raise ValueError(f"society.post_capacity={params.post_capacity} x "
                         f"society.content_len={params.content_len} tokens must stay below "
                         f"2**31 (int32 buffer indices)")
    return params


def run(config, workdir: str, progress: bool = True) -> dict:
    """Simulate `config.ticks` crowd ticks; returns the summary dict (also written). The config
    is checked (`check_config`) before the workdir is made."""
    if not workdir:
        raise ValueError(f"--workdir is required, got {workdir!r}")
    params = check_config(config)
    key = jax.random.key(config.seed)
    t0 = time.perf_counter()
    state = society.reset(jax.random.fold_in(key, 0), params)
    jax.block_until_ready(state)
    reset_s = time.perf_counter() - t0
    recsys.check(state, params)  # a registered recommender's scores, once, on this society
    os.makedirs(workdir, exist_ok=True)

    @functools.partial(jax.jit, donate_argnums=1)
    def tick(k, s):
        s, info = society.step(k, s, None, params)
        return s, info, info.agent.type_counts + info.crowd.apply.type_counts

    measure = jax.jit(functools.partial(metrics.compute, params=params))
    tick, measure, pred = _fit(tick, measure, jax.random.fold_in(key, 1), state, params)

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
        "predicted_peak_gb": pred.process_peak / 2**30,
        "metrics_path": path,
    }
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def _fit(tick, measure, key, state, params):
    """(tick, measure, prediction): both programs compiled for `state` and judged against the
    machine by the compiler's own figures (`train.fit.predict`: the resident set plus a
    program's temporaries and unaliased outputs); the larger prediction is returned, a society
    that would not fit is refused in one line (ValueError) before the first tick."""
    tick_c = tick.lower(key, state).compile()
    _, info, _ = jax.eval_shape(tick, key, state)
    measure_c = measure.lower(state, info).compile()
    fit.release_freed_memory()
    pred = max((fit.predict(c, 1) for c in (tick_c, measure_c)), key=lambda p: p.peak)
    logging.info("memory: %s", pred.line())
    if not pred.fits:
        raise ValueError(f"society.num_users={params.num_users}, society.post_capacity="
                         f"{params.post_capacity}: one tick would need {pred.line()}; lower "
                         f"them (or society.embed_dim, society.seen_memory)")
    return tick_c, measure_c, pred


def main(argv):
    """Run the simulation and print its headline numbers; a bad config is one line,
    `error: ...`, on stderr and exit status 1, with no workdir made."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/million.py:small")
    try:
        s = run(_CONFIG.value, _WORKDIR.value)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {' '.join(str(e).split())}\n")
        sys.exit(1)
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
