"""One society tick at N = 1e4, 1e5, 1e6 users (as many post slots as users).

    python benchmarks/society_scale.py                   # 1e4, 1e5, 1e6
    python benchmarks/society_scale.py --sizes 10000 100000 --ticks 3
    python benchmarks/society_scale.py --sizes 1000000 --recsys twitter twhin   # tick ratio

A tick = personalized recsys for every active crowd user (shared pool of C candidates +
in-network posts of followees) + vectorized reactions + apply_actions (segment sums, conflict
resolution); the metrics pass (two Gini sorts of N / P values) is timed separately.  Sizes come
from configs/million.py (`society_config(n)`): ~5% of users active per tick, C = 192 top + 64
random posts.  Each N runs in its own process so peak RSS is per size; compile and the first
tick are excluded, the median of `--ticks` ticks is kept.  The peer, measured in the same run at
the smallest N: OASIS's dense personalized recommender (cosine of every user x every post, then
top-k: the users x posts matrix our recsys avoids) on the same embeddings, jitted; skipped when
the smallest N is over 20,000 (that matrix would not fit).
slope = least-squares d log(seconds) / d log(N) over the sizes.
`--recsys` (default twitter) runs every size with each named recommender (configs/million.py's
sizes; twhin scores `twhin_candidates` = 4,000 random posts, as OASIS does), back to back, one
process per (N, recsys); with several, a line per N gives each one's tick / the first one's.
Last line: `n=<largest N> seconds_per_tick=... peak_rss_gb=... slope=...` (of the last recsys).
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _config(n):
    spec = importlib.util.spec_from_file_location("million", os.path.join(ROOT, "configs",
                                                                            "million.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.society_config(n)


def measure(n: int, ticks: int, peer: bool, recsys: str = "twitter") -> dict:
    import jax

    from jaxsocial.social import metrics, society

    params = society.make_params(**{**dict(_config(n)), "recsys": recsys})
    t0 = time.perf_counter()
    state = jax.block_until_ready(society.reset(jax.random.key(0), params))
    reset_s = time.perf_counter() - t0

    @functools.partial(jax.jit, donate_argnums=1)
    def tick(k, s):
        return society.step(k, s, None, params)

    measure = jax.jit(functools.partial(metrics.compute, params=params))
    t0 = time.perf_counter()
    state, info = jax.block_until_ready(tick(jax.random.key(1), state))
    first_s = time.perf_counter() - t0
    times = []
    for t in range(ticks):
        t0 = time.perf_counter()
        state, info = jax.block_until_ready(tick(jax.random.key(2 + t), state))
        times.append(time.perf_counter() - t0)
    m = jax.block_until_ready(measure(state, info))
    t0 = time.perf_counter()
    m = jax.block_until_ready(measure(state, info))
    metrics_s = time.perf_counter() - t0
    out = dict(n=n, recsys=recsys, seconds_per_tick=statistics.median(times), first_tick_s=first_s,
               reset_s=reset_s, metrics_s=metrics_s, active=int(m["active_crowd"]),
               actions=int(m["action_counts"].sum()),
               peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    if peer:  # OASIS-style dense personalized recsys over all users x all posts
        k = params.feed_size

        @jax.jit
        def dense(interest, emb):
            return jax.lax.top_k(interest @ emb.T, k)[1]

        args = (state.users.interest, state.posts.embedding)
        jax.block_until_ready(dense(*args))
        t0 = time.perf_counter()
        jax.block_until_ready(dense(*args))
        out["dense_recsys_s"] = time.perf_counter() - t0
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--ticks", type=int, default=3)
    ap.add_argument("--recsys", nargs="+", default=["twitter"],
                    choices=["random", "reddit", "twitter", "twhin"])
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.one, a.ticks, a.peer, a.recsys[0])))
        return
    import numpy as np
    rows = []
    for i, (n, rs) in enumerate((n, rs) for n in a.sizes for rs in a.recsys):
        cmd = [sys.executable, __file__, "--one", str(n), "--ticks", str(a.ticks),
               "--recsys", rs]
        if i == 0 and n <= 20_000:  # the dense peer's users x posts matrix is 4 N^2 bytes
            cmd.append("--peer")
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            sys.exit(f"n={n} recsys={rs} failed:\n{res.stderr[-3000:]}")
        row = json.loads(res.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"n={n:>9,d} recsys={rs:<7s} active={row['active']:>7,d} "
              f"actions={row['actions']:>8,d} "
              f"seconds_per_tick={row['seconds_per_tick']:.4f} "
              f"(first tick incl. compile {row['first_tick_s']:.1f} s, reset {row['reset_s']:.1f}"
              f" s, metrics {row['metrics_s']:.3f} s) peak_rss_gb={row['peak_rss_gb']:.2f}",
              flush=True)
        if "dense_recsys_s" in row:
            print(f"  peer at n={n:,d}: dense users x posts recsys alone "
                  f"{row['dense_recsys_s']:.4f} s; our whole tick / dense recsys = "
                  f"{row['seconds_per_tick'] / row['dense_recsys_s']:.3f}", flush=True)
        if rs == a.recsys[-1] and len(a.recsys) > 1:
            base = rows[-len(a.recsys)]
            print(f"  n={n:,d} seconds_per_tick / {a.recsys[0]}'s: " + " ".join(
                f"{r['recsys']}={r['seconds_per_tick'] / base['seconds_per_tick']:.2f}"
                for r in rows[-len(a.recsys):]), flush=True)
    rows = [r for r in rows if r["recsys"] == a.recsys[-1]]
    x = np.log([r["n"] for r in rows])
    y = np.log([r["seconds_per_tick"] for r in rows])
    slope = float(np.polyfit(x, y, 1)[0]) if len(rows) > 1 else float("nan")
    last = rows[-1]
    print(f"n={last['n']} seconds_per_tick={last['seconds_per_tick']:.4f} "
          f"peak_rss_gb={last['peak_rss_gb']:.2f} slope={slope:.3f}")


if __name__ == "__main__":
    main()
