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
the smallest N: OASIS's dense personalized recommender's formula (cosine of every user x every
post, then top-k: the users x posts matrix our recsys avoids) written here in JAX, jitted, on the
same embeddings and the same cores, median of `--ticks` calls after a warm-up call -- OASIS's
formula as written here, not OASIS's code; skipped when the smallest N is over 20,000 (that
matrix would not fit).
slope = least-squares d log(seconds) / d log(N) over the sizes.
`--recsys` (default twitter) runs every size with each named recommender (configs/million.py's
sizes; twhin scores `twhin_candidates` = 4,000 random posts, as OASIS does), back to back, one
process per (N, recsys); with several, a line per N gives each one's tick / the first one's.
Summary line: `n=<largest N> seconds_per_tick=... peak_rss_gb=... slope=...` (of the last
recsys), then `result: <file>` (benchmarks/results/) and the machine line, last.

Recommender alone, every user, against OASIS's reddit formulas as NumPy written here:

    python benchmarks/society_scale.py --recsys=reddit --k=100 --all_users      # 1e4, 1e5

builds N users x N posts (configs/million.py's society, feed_size = k; every user muting one
random author and having seen its first feed -- `mark_seen` of one `recommend` round, so the
seen ring is full of top posts), then times `recsys.recommend` for all N users at once (jitted,
compile excluded, median of `--calls` calls; no chunking: reddit's largest intermediates are
`[N, K]` and `[N, S + 20]`, about 40 MB each at 1e5).  reddit also times, in the same process,
the per-user top-k path instead of the sorted pool ("topk_s",
`recsys._recommend(..., sorted_pool=False)`) and OASIS's reddit recommender's formulas as NumPy
/ standard-library code written here (not OASIS's code, which reads and writes its sqlite
tables around them), over the same posts: parse every post's creation time from its
sqlite-style string ("%Y-%m-%d %H:%M:%S.%f", one `datetime.strptime` per post, as OASIS reads
its post table), hot score (NumPy, rounded to 7 decimals), one `heapq.nlargest` top-k, the same
list handed to every user (`[top] * N`, the rec matrix OASIS returns) -- "oasis_s";
"oasis_rows_s" adds building the N * k (user, post) rows OASIS then inserts into its rec table
(the sqlite insert itself not counted).  That rendering is single-threaded Python + NumPy, as
OASIS's recommender is; ours is jitted on all the process's cores.
ratio = oasis_s / ours_s (>= 1: ours is faster).  One process per N.  Summary line:
`n=<largest N> recsys=... ours_s=... oasis_s=... ratio=...` (the last reddit row; no oasis_s for
the other recommenders), then `result: <file>` and the machine line, last.
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

from common import NO_RECORD_HELP, finish  # noqa: E402  benchmarks/: the result file

PEER = "OASIS's formulas as NumPy written here, not OASIS's code"
DENSE_PEER = "OASIS's dense recsys formula as JAX written here, not OASIS's code"


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
    if peer:  # OASIS's dense personalized recsys formula: all users x all posts, then top-k
        k = params.feed_size

        @jax.jit
        def dense(interest, emb):
            return jax.lax.top_k(interest @ emb.T, k)[1]

        args = (state.users.interest, state.posts.embedding)
        jax.block_until_ready(dense(*args))
        dense_t = []
        for _ in range(ticks):  # as many timed calls as our ticks, median: the same rule
            t0 = time.perf_counter()
            jax.block_until_ready(dense(*args))
            dense_t.append(time.perf_counter() - t0)
        out["dense_recsys_s"] = statistics.median(dense_t)
    return out


def _oasis_reddit(created, likes, dislikes, post_ids, n_users, k, rows=False):
    """OASIS's reddit recommender rendered in NumPy + the standard library (our own code): every
    post's created_at string parsed, hot score, one heapq top-k handed to all users."""
    import datetime
    import heapq

    import numpy as np
    epoch = datetime.datetime(1970, 1, 1)
    sec = np.array([(datetime.datetime.strptime(c, "%Y-%m-%d %H:%M:%S.%f") - epoch)
                    .total_seconds() for c in created])
    s = likes - dislikes
    hot = np.round(np.sign(s) * np.log10(np.maximum(np.abs(s), 1))
                   + (sec - 1134028003) / 45000, 7)
    top = [pid for _, pid in heapq.nlargest(k, zip(hot.tolist(), post_ids), key=lambda t: t[0])]
    rec = [top] * n_users
    if rows:  # the rec-table rows OASIS inserts: (user, post) for every user's list
        rec = [(u, p) for u in range(n_users) for p in rec[u]]
    return top, rec


def measure_recsys(n: int, k: int, recsys_name: str, calls: int) -> dict:
    """All-users `recsys.recommend` at N users x N posts, feed size k (see the module doc)."""
    import datetime

    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxsocial.social import recsys, society
    from jaxsocial.social.state import PostKind

    cfg = dict(_config(n))
    params = society.make_params(**{**cfg, "recsys": recsys_name, "feed_size": k,
                                    "num_seed_posts": n,  # N users x N posts
                                    "pool_size": max(cfg["pool_size"], k + cfg["overfetch"])})
    state = society.reset(jax.random.key(0), params)
    users = jnp.arange(n, dtype=jnp.int32)
    rng = np.random.default_rng(0)
    muted = np.full((n, params.max_muted), -1, np.int32)
    muted[:, 0] = rng.integers(0, n, n)
    state = state.replace(graph=state.graph.replace(muted=jnp.asarray(muted)))
    ours = jax.jit(lambda key, s: recsys.recommend(key, s, users, params))
    state = jax.block_until_ready(
        recsys.mark_seen(state, users, ours(jax.random.key(1), state), params))

    def timed(f, *args):
        out = jax.block_until_ready(f(*args))  # compile / warm-up
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), out

    key = jax.random.key(2)
    out = dict(n=n, k=k, recsys=recsys_name, calls=calls)
    out["ours_s"], feed = timed(ours, key, state)
    out["valid_frac"] = float(np.asarray(feed.valid).mean())
    if recsys_name == "reddit" and hasattr(recsys, "_recommend"):
        ref = jax.jit(lambda key, s: recsys._recommend(key, s, users, params,
                                                          sorted_pool=False))
        out["topk_s"], rfeed = timed(ref, key, state)
        out["same_feeds"] = bool(np.array_equal(np.asarray(feed.ids), np.asarray(rfeed.ids)))
    if recsys_name == "reddit":
        s = jax.device_get(state)
        live = (s.posts.id >= 0) & (s.posts.kind != PostKind.COMMENT)
        sec = params.start_seconds + s.posts.created_at[live].astype(np.int64) \
            * params.seconds_per_tick
        start = datetime.datetime(1970, 1, 1)
        created = [(start + datetime.timedelta(seconds=int(x))).strftime("%Y-%m-%d %H:%M:%S.%f")
                   for x in sec]
        args = (created, s.posts.likes[live].astype(np.int64),
                s.posts.dislikes[live].astype(np.int64), s.posts.id[live].tolist(), n, k)
        ts, rs = [], []
        for _ in range(calls):
            t0 = time.perf_counter()
            top, _ = _oasis_reddit(*args)
            ts.append(time.perf_counter() - t0)
        out["oasis_s"] = statistics.median(ts)
        for _ in range(max(1, calls // 2)):
            t0 = time.perf_counter()
            _oasis_reddit(*args, rows=True)
            rs.append(time.perf_counter() - t0)
        out["oasis_rows_s"] = statistics.median(rs)
        pslot, _ = recsys._pool(key, state, params)  # our shared list before per-user filters
        mine = np.asarray(state.posts.id[pslot])[:k]
        out["top_overlap"] = len(set(mine.tolist()) & set(top)) / k
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def main_recsys(a):
    print(f"# recommender alone, every user; peer: {PEER}", flush=True)
    rows = []
    for n in a.sizes:
        for rs in a.recsys:
            cmd = [sys.executable, __file__, "--one", str(n), "--all_users", "--k", str(a.k),
                   "--calls", str(a.calls), "--recsys", rs]
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if res.returncode != 0:
                sys.exit(f"n={n} recsys={rs} failed:\n{res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append(r)
            line = (f"n={n:>9,d} recsys={rs:<7s} k={a.k} users=all ours_s={r['ours_s']:.4f}")
            if "topk_s" in r:
                line += (f" topk_path_s={r['topk_s']:.4f} (same feeds: {r['same_feeds']})")
            if "oasis_s" in r:
                line += (f" oasis_s={r['oasis_s']:.4f} ratio={r['oasis_s'] / r['ours_s']:.2f}"
                         f" (oasis_rows_s={r['oasis_rows_s']:.4f}, top-k overlap "
                         f"{r['top_overlap']:.2f})")
            line += f" valid={r['valid_frac']:.3f} peak_rss_gb={r['peak_rss_gb']:.2f}"
            print(line, flush=True)
    last = next((r for r in reversed(rows) if "oasis_s" in r), rows[-1])
    figures = {"mode": "all_users", "peer": PEER, "n": last["n"], "recsys": last["recsys"],
               "ours_s": last["ours_s"], "oasis_s": last.get("oasis_s"),
               "ratio": last["oasis_s"] / last["ours_s"] if "oasis_s" in last else None,
               "rows": rows}
    print(f"n={last['n']} recsys={last['recsys']} ours_s={last['ours_s']:.4f}"
          + (f" oasis_s={last['oasis_s']:.4f} ratio={figures['ratio']:.2f} ({PEER})"
             if "oasis_s" in last else ""))
    finish("society_scale_recsys", figures, record=not a.no_record)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--ticks", type=int, default=3)
    ap.add_argument("--recsys", nargs="+", default=["twitter"],
                    choices=["random", "reddit", "twitter", "twhin"])
    ap.add_argument("--all_users", action="store_true",
                    help="time the recommender alone for every user (and OASIS's, reddit)")
    ap.add_argument("--k", type=int, default=100, help="feed size with --all_users")
    ap.add_argument("--calls", type=int, default=5, help="timed calls with --all_users")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    a = ap.parse_args()
    if a.all_users:
        if a.sizes == ap.get_default("sizes"):
            a.sizes = [10_000, 100_000]
        if a.one:
            print(json.dumps(measure_recsys(a.one, a.k, a.recsys[0], a.calls)))
        else:
            main_recsys(a)
        return
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
            print(f"  peer at n={n:,d} ({DENSE_PEER}): dense users x posts recsys alone "
                  f"{row['dense_recsys_s']:.4f} s; our whole tick / dense recsys = "
                  f"{row['seconds_per_tick'] / row['dense_recsys_s']:.3f}", flush=True)
        if rs == a.recsys[-1] and len(a.recsys) > 1:
            base = rows[-len(a.recsys)]
            print(f"  n={n:,d} seconds_per_tick / {a.recsys[0]}'s: " + " ".join(
                f"{r['recsys']}={r['seconds_per_tick'] / base['seconds_per_tick']:.2f}"
                for r in rows[-len(a.recsys):]), flush=True)
    all_rows = rows
    rows = [r for r in rows if r["recsys"] == a.recsys[-1]]
    x = np.log([r["n"] for r in rows])
    y = np.log([r["seconds_per_tick"] for r in rows])
    slope = float(np.polyfit(x, y, 1)[0]) if len(rows) > 1 else float("nan")
    last = rows[-1]
    print(f"n={last['n']} seconds_per_tick={last['seconds_per_tick']:.4f} "
          f"peak_rss_gb={last['peak_rss_gb']:.2f} slope={slope:.3f}")
    figures = {"mode": "tick", "n": last["n"], "recsys": last["recsys"],
               "seconds_per_tick": last["seconds_per_tick"], "peak_rss_gb": last["peak_rss_gb"],
               "slope": slope, "rows": all_rows}
    if any("dense_recsys_s" in r for r in all_rows):
        figures["peer"] = DENSE_PEER
    finish("society_scale", figures, record=not a.no_record)


if __name__ == "__main__":
    main()
