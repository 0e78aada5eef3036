"""Your own recommender beside twitter: one society tick at 1e5 users.

    python benchmarks/recsys_register.py                       # 1e5 users, 5 ticks, 2 rounds
    python benchmarks/recsys_register.py --n 10000 --ticks 3 --rounds 1 --no_record

The society is configs/million.py's `society_config(n)` (the one benchmarks/society_scale.py
times: ~5% of the users active per tick, twitter's candidates C = 192 pool + 64 random posts
and I = 8 in-network posts), run with recsys="twitter", with docs/society.md's example
`newest_liked` registered (`recsys.register`; it ranks the same candidates), and with `zeros`
registered, a function that returns zeros (the registered path's own cost without scoring
work; its feeds follow the pool's order), nothing else changed.  Each (round, recommender)
runs in its own process, the order reversed every other round; in each, compile and the first
tick are excluded and the median of `--ticks` ticks is kept (`tick_s`; beside it the crowd's
applied actions per timed tick: the feeds differ, so the crowd reacts differently too), then
`recsys.recommend` alone for `max_active` random users, the median of `--ticks` calls after a
compile call (`recommend_s`).  Figures: each recommender's median over the rounds, and each
registered one's over twitter's (> 1: slower).  Summary line `n=... twitter_tick_s=...
newest_liked_tick_s=... ratio=...` and a line per figure, then `result: <file>`
(benchmarks/results/) and the machine line, last.
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

NAMES = ("twitter", "newest_liked", "zeros")


def newest_liked(user, candidates, state):  # docs/society.md's example, as written there
    post = state.posts.slot(candidates)
    liked = state.posts.likes[post] > 0
    kin = state.users.persona[state.posts.author[post]] == state.users.persona[user][:, None]
    return 100.0 * liked + 10.0 * kin - (state.tick - state.posts.created_at[post])


def zeros(user, candidates, state):  # the registered path's own cost: no scoring work
    import jax.numpy as jnp
    return jnp.zeros(candidates.shape, jnp.float32)


def _config(n: int):
    spec = importlib.util.spec_from_file_location(
        "million", os.path.join(ROOT, "configs", "million.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return dict(mod.society_config(n))


def measure(n: int, ticks: int, name: str) -> dict:
    import jax

    from jaxsocial.social import recsys, society

    recsys.register("newest_liked", newest_liked)
    recsys.register("zeros", zeros)
    params = society.make_params(**{**_config(n), "recsys": name})
    state = jax.block_until_ready(society.reset(jax.random.key(0), params))
    recsys.check(state, params)

    @functools.partial(jax.jit, donate_argnums=1)
    def tick(k, s):
        s, info = society.step(k, s, None, params)
        return s, info.crowd.apply.type_counts.sum()  # the crowd's applied actions

    state, _ = jax.block_until_ready(tick(jax.random.key(1), state))  # compile, first tick
    times, actions = [], []
    for t in range(ticks):
        t0 = time.perf_counter()
        state, n_act = jax.block_until_ready(tick(jax.random.key(2 + t), state))
        times.append(time.perf_counter() - t0)
        actions.append(int(n_act))
    rec = jax.jit(recsys.recommend, static_argnums=3)
    users = jax.random.choice(jax.random.key(99), n, (params.max_active,), replace=False)
    jax.block_until_ready(rec(jax.random.key(0), state, users, params))
    calls = []
    for t in range(ticks):
        t0 = time.perf_counter()
        feed = jax.block_until_ready(rec(jax.random.key(1 + t), state, users, params))
        calls.append(time.perf_counter() - t0)
    return dict(recsys=name, n=n, tick_s=statistics.median(times), ticks=times,
                actions_per_tick=statistics.mean(actions),
                recommend_s=statistics.median(calls), recommend_users=params.max_active,
                feed_valid=float(feed.valid.mean()),
                peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def _one(n: int, ticks: int, name: str) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--n", str(n), "--ticks", str(ticks)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    if res.returncode != 0:
        sys.exit(f"recsys={name} n={n} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000, help="users (= post slots)")
    ap.add_argument("--ticks", type=int, default=5, help="timed ticks (and recommend calls)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per recommender")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.n, a.ticks, a.one)))
        return
    rows = []
    for r in range(a.rounds):
        for name in (NAMES if r % 2 == 0 else NAMES[::-1]):
            row = _one(a.n, a.ticks, name)
            rows.append(row)
            print(f"round {r + 1} recsys={name:<12s} tick_s={row['tick_s']:.4f} "
                  f"(crowd actions {row['actions_per_tick']:,.0f}) "
                  f"recommend_s={row['recommend_s']:.4f} ({row['recommend_users']:,d} users, "
                  f"valid {row['feed_valid']:.3f}) peak_rss_gb={row['peak_rss_gb']:.2f}",
                  flush=True)
    med = {(name, k): statistics.median(r[k] for r in rows if r["recsys"] == name)
           for name in NAMES for k in ("tick_s", "recommend_s")}
    figures = {"n": a.n, "ticks": a.ticks, "rounds": a.rounds, "rows": rows,
               "example": "docs/society.md's newest_liked, registered with recsys.register"}
    for name in NAMES:
        figures[f"{name}_tick_s"] = med[name, "tick_s"]
        figures[f"{name}_recommend_s"] = med[name, "recommend_s"]
    for name in NAMES[1:]:
        for k in ("tick", "recommend"):
            figures[f"{name}_{k}_ratio"] = med[name, f"{k}_s"] / med["twitter", f"{k}_s"]
    figures["tick_ratio"] = figures["newest_liked_tick_ratio"]
    print(f"n={a.n} twitter_tick_s={med['twitter', 'tick_s']:.4f} "
          f"newest_liked_tick_s={med['newest_liked', 'tick_s']:.4f} "
          f"ratio={figures['tick_ratio']:.3f}")
    for k in ("tick", "recommend"):
        print(f"  {k}: " + ", ".join(f"{name} {med[name, k + '_s']:.4f} s" for name in NAMES)
              + "; / twitter's: " + ", ".join(f"{name} {figures[f'{name}_{k}_ratio']:.3f}"
                                             for name in NAMES[1:]))
    finish("recsys_register", figures, record=not a.no_record)


if __name__ == "__main__":
    main()
