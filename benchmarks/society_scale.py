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

Recommender alone, every user, against OASIS's own code and our NumPy rendering of it:

    python benchmarks/society_scale.py --recsys=reddit --k=100 --all_users \
        --oasis_python=/tmp/oasis-venv/bin/python                             # 1e4, 1e5
    python benchmarks/society_scale.py --recsys random --k=100 --all_users ...  # rec_sys_random

builds N users x N posts (configs/million.py's society, feed_size = k; every user muting one
random author and having seen its first feed -- `mark_seen` of one `recommend` round, so the
seen ring is full of top posts), then times, each as the median of `--calls` calls after one
warm-up (compile) call, on the same posts and the same cores:
- "ours_s": `recsys.recommend` for all N users at once (jitted; no chunking: reddit's largest
  intermediates are `[N, K]` and `[N, S + 20]`, about 40 MB each at 1e5), with the per-user
  filters (own, muted, seen posts) and exploration; reddit also "topk_s", the per-user top-k path
  instead of the sorted pool (`recsys._recommend(..., sorted_pool=False)`, same feeds checked),
  and "ours_plain_s": ours with OASIS's semantics (exclude_own=False, seen_policy="none",
  explore_frac=0, no mutes: one list for every user, as OASIS hands out);
- "oasis_code_s": OASIS's own function (camel-oasis, `oasis.social_platform.recsys.rec_sys_reddit`
  / `rec_sys_random`), run in the interpreter `--oasis_python` (default $JAXSOCIAL_OASIS_PYTHON,
  else this one; a subprocess: camel-oasis pins transformers<5, so it lives in its own venv, see
  benchmarks/oasis-requirements.txt) on the inputs it takes from its sqlite platform: the post
  table as `fetch_table_from_db` returns it (`oasis_post_table`: one dict per post, created_at
  the string sqlite stores) and the rec matrix of N empty lists.  OASIS's twitter and twhin
  recommenders are skipped with the reason (`OASIS_CANNOT`: they need a hub model, or score at
  random).  Not installed: the row is skipped with a line saying how to install it; the rest
  still runs;
- "numpy_rendering_s" (reddit): our NumPy / standard-library rendering of OASIS's formulas (one
  `datetime.strptime` per post's created_at string, hot score rounded to 7 decimals, one
  `heapq.nlargest` top-k, `[top] * N`); "numpy_rendering_rows_s" adds building the N * k (user,
  post) rows OASIS then inserts into its rec table (the sqlite insert itself not counted).
OASIS's code and the rendering are single-threaded Python + NumPy; ours is jitted on all the
process's cores.  Agreement (reddit, `reddit_agreement`): every user's `ours_plain` feed against
OASIS's list, scored by OASIS's own hot scores (`calculate_hot_score` of every post): equal up
to ties (posts of equal score in another order), in the same order; and the largest |our hot
score - OASIS's| over all posts.  random: OASIS's rows have k distinct live posts each.
Ratios = oasis_code_s / ours_s and numpy_rendering_s / ours_s (>= 1: ours is faster).  One
process per N.  Summary line: `n=<largest N> recsys=... ours_s=... oasis_code_s=... ratio=...
numpy_rendering_s=... ratio=...` (the last row with an OASIS figure), a line per skipped
OASIS-code row, then `result: <file>` and the machine line, last.
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

PEER = "our NumPy rendering of OASIS's formulas (not OASIS's code)"
DENSE_PEER = "OASIS's dense recsys formula as JAX written here, not OASIS's code"
OASIS_PIN = "camel-oasis==0.2.5"  # benchmarks/oasis-requirements.txt: the version these runs used
OASIS_ENV = "JAXSOCIAL_OASIS_PYTHON"  # an interpreter with camel-oasis (the default of the flag)
OASIS_INSTALL = (f"python -m venv --system-site-packages /tmp/oasis-venv && /tmp/oasis-venv/bin/"
                 f"pip install -r benchmarks/oasis-requirements.txt ({OASIS_PIN} and what its "
                 f"imports need), then --oasis_python="
                 f"/tmp/oasis-venv/bin/python or {OASIS_ENV}=/tmp/oasis-venv/bin/python")
OASIS_FNS = {"reddit": "rec_sys_reddit", "random": "rec_sys_random"}  # oasis.social_platform.recsys
OASIS_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"  # the form rec_sys_reddit parses first
# OASIS's recommenders that cannot run here, and why (printed and recorded)
OASIS_CANNOT = {
    "twitter": "Platform's twitter recommender, rec_sys_personalized_with_trace, scores posts by "
               "random.random() while its module-level `model` is None (it loads none) and calls "
               "post_ids.index per (user, post): O(N P^2) Python, hours at 1e4; "
               "rec_sys_personalized loads the SentenceTransformer 'paraphrase-MiniLM-L6-v2' "
               "from the Hugging Face hub; no download here",
    "twhin": "rec_sys_personalized_twh loads 'Twitter/twhin-bert-base' from the Hugging Face hub "
             "(or calls OpenAI's embedding API with use_openai_embedding); no download here",
}


def _config(n, root=ROOT):
    spec = importlib.util.spec_from_file_location("million", os.path.join(root, "configs",
                                                                            "million.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.society_config(n)


def measure(n: int, ticks: int, peer: bool, recsys: str = "twitter", root: str = ROOT) -> dict:
    import jax

    from jaxsocial.social import metrics, society

    params = society.make_params(**{**dict(_config(n, root)), "recsys": recsys})
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
               reset_s=reset_s, metrics_s=metrics_s, **_instruments(state, params, ticks),
               active=int(m["active_crowd"]),
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


def _instruments(state, params, calls: int) -> dict:
    """Seconds (median of `calls` after a compile call) of the per-epoch instruments on the
    society after the timed ticks: `cascades_s` (`social.cascades` of every post) and
    `polarisation_s` (`social.polarisation.summary`). Empty where the code has no instruments
    (a --baseline before them)."""
    import jax
    try:
        from jaxsocial.social import cascades, polarisation
    except ImportError:
        return {}
    fns = {"cascades_s": (jax.jit(cascades.cascades), (state.posts,)),
           "polarisation_s": (jax.jit(functools.partial(polarisation.summary, params=params)),
                              (jax.random.key(7), state))}
    out = {}
    for name, (f, args) in fns.items():
        jax.block_until_ready(f(*args))
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
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
    return top, rec, hot


# ----------------------------------------------------------------------------------------------
# OASIS's own code as the peer (camel-oasis, run in the interpreter given by --oasis_python)


def oasis_created_at(seconds) -> list:
    """OASIS's post.created_at strings for Unix seconds: the `str(datetime)` sqlite stores for a
    reddit post, with microseconds (`OASIS_TIME_FORMAT`, the format rec_sys_reddit tries first)."""
    import datetime
    epoch = datetime.datetime(1970, 1, 1)
    return [(epoch + datetime.timedelta(seconds=int(x))).strftime(OASIS_TIME_FORMAT)
            for x in seconds]


def oasis_post_table(post_id, author, created_seconds, likes, dislikes, original=None) -> list:
    """OASIS's post table as `fetch_table_from_db(cursor, "post")` hands it to its recommenders:
    one dict per row with the columns of its post.sql, in post_id order (its `SELECT *` order).
    `original` (-1 = none) is the reposted post's id (original_post_id)."""
    import numpy as np
    post_id = np.asarray(post_id).astype(np.int64)
    order = np.argsort(post_id, kind="stable")
    created = oasis_created_at(np.asarray(created_seconds)[order])
    orig = (np.full(post_id.shape, -1) if original is None else np.asarray(original))[order]
    cols = [post_id[order], np.asarray(author)[order], np.asarray(likes)[order],
            np.asarray(dislikes)[order]]
    return [{"post_id": p, "user_id": u, "original_post_id": None if o < 0 else o,
             "content": "", "quote_content": None, "created_at": c, "num_likes": lk,
             "num_dislikes": dk, "num_shares": 0, "num_reports": 0}
            for p, u, lk, dk, o, c in zip(*(x.tolist() for x in cols), orig.tolist(), created)]


def reddit_agreement(feeds, peer_top, peer_ids, peer_hot, tol: float = 1e-4) -> dict:
    """Whether every row of `feeds [N, K]` (post ids) is the peer's top-k list `peer_top [K]` up to
    ties, scored by the peer's own hot scores (`peer_hot [P]` of `peer_ids [P]`): a row agrees
    when its ids are distinct peer posts and its i-th post's peer score is within `tol` of the
    peer's i-th post's score for every i (so it differs only by posts of equal score).  Returns
    users, equal_up_to_ties (rows that agree), exact_order (rows equal to peer_top) and max_gap
    (the largest |score difference| at a position)."""
    import numpy as np
    feeds = np.asarray(feeds, np.int64)
    peer_ids, peer_hot = np.asarray(peer_ids, np.int64), np.asarray(peer_hot, np.float64)
    order = np.argsort(peer_ids)
    sid, shot = peer_ids[order], peer_hot[order]
    pos = np.clip(np.searchsorted(sid, feeds), 0, sid.size - 1)
    found = sid[pos] == feeds
    top = np.asarray(peer_top, np.int64)
    ref = shot[np.searchsorted(sid, top)]
    if feeds.shape[1] != top.size:
        raise ValueError(f"feed size {feeds.shape[1]} != peer's list {top.size}")
    gap = np.where(found, np.abs(shot[pos] - ref[None]), np.inf)
    srt = np.sort(feeds, axis=1)
    distinct = (np.diff(srt, axis=1) != 0).all(axis=1)
    ok = found.all(1) & distinct & (gap <= tol).all(1)
    return {"users": int(feeds.shape[0]), "equal_up_to_ties": int(ok.sum()),
            "exact_order": int((feeds == top[None]).all(1).sum()),
            "max_gap": float(gap.max()) if gap.size else 0.0, "tol": tol}


def oasis_python(flag: str | None = None) -> str:
    """The interpreter that runs OASIS's code: `flag`, else $JAXSOCIAL_OASIS_PYTHON, else
    this one."""
    return flag or os.environ.get(OASIS_ENV) or sys.executable


def run_oasis(python: str, fn: str, post_table_args: dict, n_users: int, k: int,
              calls: int) -> dict:
    """Time OASIS's `oasis.social_platform.recsys.<OASIS_FNS[fn]>` in `python` (a subprocess:
    `society_scale.py --oasis_worker DIR`) on the post table built from `post_table_args`
    (`oasis_post_table`'s arguments) for `n_users` users, `k` posts each.  Returns the worker's
    dict (seconds, version, top / checks), or {"skipped": reason} when OASIS cannot be imported."""
    import tempfile

    import numpy as np
    with tempfile.TemporaryDirectory() as d:
        np.savez(os.path.join(d, "in.npz"), n_users=n_users, k=k, calls=calls, fn=fn,
                 **{a: np.asarray(v) for a, v in post_table_args.items()})
        # cwd = the temporary folder: importing OASIS writes log files under ./log/
        res = subprocess.run([python, os.path.abspath(__file__), "--oasis_worker", d],
                             capture_output=True, text=True, cwd=d)
        out = os.path.join(d, "out.json")
        if res.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"OASIS worker failed ({python}):\n{res.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def _oasis_worker(d: str) -> None:
    """In the OASIS interpreter: build the post table, time OASIS's function (one warm-up call,
    then the median of `calls`), write out.json.  Needs only NumPy besides camel-oasis."""
    import importlib.metadata
    import random

    import numpy as np
    z = np.load(os.path.join(d, "in.npz"))
    n_users, k, calls, fn = int(z["n_users"]), int(z["k"]), int(z["calls"]), str(z["fn"])
    args = {a: z[a] for a in ("post_id", "author", "created_seconds", "likes", "dislikes")}
    out = {"python": sys.executable}
    try:
        from oasis.social_platform import recsys as orec
        out["version"] = importlib.metadata.version("camel-oasis")
    except Exception as e:  # noqa: BLE001  any import failure is a skip with its reason
        out["skipped"] = (f"camel-oasis not importable in {sys.executable} "
                          f"({type(e).__name__}: {e}); install: {OASIS_INSTALL}")
        with open(os.path.join(d, "out.json"), "w") as f:
            json.dump(out, f)
        return
    post_table = oasis_post_table(**args)
    rec_matrix = [[] for _ in range(n_users)]  # fetch_rec_table_as_matrix of an empty rec table
    f = getattr(orec, OASIS_FNS[fn])
    random.seed(0)
    new = f(post_table, rec_matrix, k)  # warm-up, as our compile call
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        new = f(post_table, rec_matrix, k)
        ts.append(time.perf_counter() - t0)
    out.update(function=f"oasis.social_platform.recsys.{OASIS_FNS[fn]}", seconds=ts,
               median_s=statistics.median(ts), users=len(new))
    ids = set(args["post_id"].tolist())
    out["rows_k_distinct_posts"] = sum(len(r) == k and len(set(r)) == k and set(r) <= ids
                                       for r in new)
    if fn == "reddit":
        out["top"] = list(new[0])
        out["same_list_for_all"] = all(r == new[0] for r in new)
        # OASIS's own hot score of every post, from the same strings it parses
        out["hot"] = [orec.calculate_hot_score(p["num_likes"], p["num_dislikes"],
                                               datetime_parse(p["created_at"]))
                      for p in post_table]
        out["hot_ids"] = [p["post_id"] for p in post_table]
    with open(os.path.join(d, "out.json"), "w") as f:
        json.dump(out, f)


def datetime_parse(s: str):
    import datetime
    return datetime.datetime.strptime(s, OASIS_TIME_FORMAT)


def measure_recsys(n: int, k: int, recsys_name: str, calls: int, oasis_py: str | None = None
                   ) -> dict:
    """All-users `recsys.recommend` at N users x N posts, feed size k (see the module doc)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxsocial.social import recsys, society
    from jaxsocial.social.state import PostKind

    cfg = dict(_config(n))
    params = society.make_params(**{**cfg, "recsys": recsys_name, "feed_size": k,
                                    "num_seed_posts": n,  # N users x N posts
                                    "pool_size": max(cfg["pool_size"], k + cfg["overfetch"])})
    state = state0 = society.reset(jax.random.key(0), params)  # state0: no mutes, nothing seen
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
    if recsys_name not in OASIS_FNS:
        out["oasis_code_skipped"] = OASIS_CANNOT.get(recsys_name, "no OASIS counterpart")
        out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return out
    # the same live posts as OASIS's post table (comments live in OASIS's comment table)
    s = jax.device_get(state)
    live = (s.posts.id >= 0) & (s.posts.kind != PostKind.COMMENT)
    table = dict(post_id=s.posts.id[live].astype(np.int64), author=s.posts.author[live],
                 created_seconds=np.asarray(recsys.post_seconds(
                     s, params, s.posts.created_at[live].astype(np.int64))),
                 likes=s.posts.likes[live].astype(np.int64),
                 dislikes=s.posts.dislikes[live].astype(np.int64))
    if recsys_name == "reddit":
        # ours with OASIS's semantics (no per-user filters: OASIS hands every user one list),
        # the feeds both peers are checked against
        plain_params = society.make_params(**{**cfg, "recsys": "reddit", "feed_size": k,
                                              "num_seed_posts": n,
                                              "pool_size": params.pool_size,
                                              "exclude_own": False, "seen_policy": "none",
                                              "explore_frac": 0.0})
        plain = jax.jit(lambda key, s: recsys.recommend(key, s, users, plain_params))
        out["ours_plain_s"], pfeed = timed(plain, key, state0)
        pfeed_ids = np.asarray(pfeed.ids)
        args = (oasis_created_at(table["created_seconds"]), table["likes"], table["dislikes"],
                table["post_id"].tolist(), n, k)
        ts, rs = [], []
        for _ in range(calls):
            t0 = time.perf_counter()
            top, _, hot = _oasis_reddit(*args)
            ts.append(time.perf_counter() - t0)
        out["numpy_rendering_s"] = statistics.median(ts)
        for _ in range(max(1, calls // 2)):
            t0 = time.perf_counter()
            _oasis_reddit(*args, rows=True)
            rs.append(time.perf_counter() - t0)
        out["numpy_rendering_rows_s"] = statistics.median(rs)
        out["numpy_rendering_agreement"] = reddit_agreement(pfeed_ids, top, table["post_id"], hot)
        now = int(recsys.post_seconds(s, params, int(s.tick)))
        ours_hot = np.asarray(recsys.reddit_hot_score(table["likes"], table["dislikes"],
                                                      table["created_seconds"],
                                                      reference_seconds=now), np.float64)
    py = oasis_python(oasis_py)
    o = run_oasis(py, recsys_name, table, n, k, calls)
    if "skipped" in o:
        out["oasis_code_skipped"] = o["skipped"]
    else:
        out.update(oasis_code_s=o["median_s"], oasis_code_version=o["version"],
                   oasis_code_function=o["function"], oasis_code_python=o["python"],
                   oasis_code_rows_ok=o["rows_k_distinct_posts"], oasis_code_users=o["users"])
        if recsys_name == "reddit":
            out["oasis_code_same_list_for_all"] = o["same_list_for_all"]
            out["oasis_code_agreement"] = reddit_agreement(pfeed_ids, o["top"], o["hot_ids"],
                                                           o["hot"])
            # OASIS's hot scores (float64, rounded to 7 decimals) in our reference form
            order = np.argsort(table["post_id"])
            theirs = np.asarray(o["hot"]) - (now - 1134028003) / 45000
            out["hot_score_max_abs_diff"] = float(np.abs(ours_hot[order] - theirs).max())
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def _agree(a: dict) -> str:
    return (f"{a['equal_up_to_ties']}/{a['users']} feeds equal up to ties "
            f"({a['exact_order']} in the same order), max score gap {a['max_gap']:.1e}")


def main_recsys(a):
    print("# recommender alone, every user; rows: ours (jaxsocial, jitted), OASIS's code "
          f"({OASIS_PIN} in --oasis_python={oasis_python(a.oasis_python)}), {PEER}", flush=True)
    rows = []
    for n in a.sizes:
        for rs in a.recsys:
            cmd = [sys.executable, __file__, "--one", str(n), "--all_users", "--k", str(a.k),
                   "--calls", str(a.calls), "--recsys", rs,
                   "--oasis_python", oasis_python(a.oasis_python)]
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if res.returncode != 0:
                sys.exit(f"n={n} recsys={rs} failed:\n{res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"n={n:>9,d} recsys={rs} k={a.k} users=all (median of {a.calls} calls after a "
                  f"warm-up call; peak_rss_gb={r['peak_rss_gb']:.2f})", flush=True)
            print(f"  ours (recsys.recommend: per-user own / muted / seen filters, exploration)"
                  f" ours_s={r['ours_s']:.4f} valid={r['valid_frac']:.3f}", flush=True)
            if "topk_s" in r:
                print(f"  ours, per-user top-k path instead of the sorted pool topk_path_s="
                      f"{r['topk_s']:.4f} (same feeds: {r['same_feeds']})", flush=True)
            if "ours_plain_s" in r:
                print(f"  ours with OASIS's semantics (one list, no per-user filters) "
                      f"ours_plain_s={r['ours_plain_s']:.4f}", flush=True)
            if "oasis_code_s" in r:
                line = (f"  OASIS's code ({r['oasis_code_function']}, camel-oasis "
                        f"{r['oasis_code_version']}, single-threaded Python) oasis_code_s="
                        f"{r['oasis_code_s']:.4f} "
                        f"oasis_code/ours={r['oasis_code_s'] / r['ours_s']:.2f}")
                if "oasis_code_agreement" in r:
                    line += (f" oasis_code/ours_plain={r['oasis_code_s'] / r['ours_plain_s']:.2f}"
                             f"; agreement with ours_plain: {_agree(r['oasis_code_agreement'])};"
                             f" hot score max |ours - OASIS's| = {r['hot_score_max_abs_diff']:.1e}")
                else:
                    line += (f"; rows of {a.k} distinct live posts: OASIS "
                             f"{r['oasis_code_rows_ok']}/{r['oasis_code_users']}")
                print(line, flush=True)
            else:
                print(f"  OASIS's code: SKIPPED ({r.get('oasis_code_skipped')})", flush=True)
            if "numpy_rendering_s" in r:
                print(f"  {PEER}: numpy_rendering_s={r['numpy_rendering_s']:.4f} "
                      f"numpy_rendering/ours={r['numpy_rendering_s'] / r['ours_s']:.2f} "
                      f"(+ rec-table rows {r['numpy_rendering_rows_s']:.4f} s); agreement with "
                      f"ours_plain: {_agree(r['numpy_rendering_agreement'])}", flush=True)
    last = next((r for r in reversed(rows) if "oasis_code_s" in r),
                next((r for r in reversed(rows) if "numpy_rendering_s" in r), rows[-1]))

    def ratio(x):
        return last[x] / last["ours_s"] if x in last else None

    figures = {"mode": "all_users", "peer": f"OASIS's code ({OASIS_PIN}); {PEER}",
               "n": last["n"], "recsys": last["recsys"], "ours_s": last["ours_s"],
               "ours_plain_s": last.get("ours_plain_s"),
               "oasis_code_s": last.get("oasis_code_s"),
               "numpy_rendering_s": last.get("numpy_rendering_s"),
               "oasis_code_ratio": ratio("oasis_code_s"),
               "numpy_rendering_ratio": ratio("numpy_rendering_s"),
               "oasis_code_skipped": sorted({r["oasis_code_skipped"] for r in rows
                                             if "oasis_code_skipped" in r}),
               "rows": rows}
    line = f"n={last['n']} recsys={last['recsys']} ours_s={last['ours_s']:.4f}"
    if "oasis_code_s" in last:
        line += f" oasis_code_s={last['oasis_code_s']:.4f} ratio={figures['oasis_code_ratio']:.2f}"
    if "numpy_rendering_s" in last:
        line += (f" numpy_rendering_s={last['numpy_rendering_s']:.4f} "
                 f"ratio={figures['numpy_rendering_ratio']:.2f}")
    print(line)
    for why in figures["oasis_code_skipped"]:
        print(f"OASIS-code row skipped: {why}")
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
    ap.add_argument("--oasis_python", default=None,
                    help=f"interpreter with {OASIS_PIN} that runs OASIS's recommenders with "
                         f"--all_users (default ${OASIS_ENV}, else this one); install: "
                         f"{OASIS_INSTALL}")
    ap.add_argument("--oasis_worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--baseline", default="",
                    help="git revision: also time its code (a temporary git worktree, its own "
                         "configs/million.py) at every size, in the same run, and print "
                         "baseline / ours")
    ap.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    a = ap.parse_args()
    if a.oasis_worker:
        _oasis_worker(a.oasis_worker)
        return
    if a.all_users:
        if a.sizes == ap.get_default("sizes"):
            a.sizes = [10_000, 100_000]
        if a.one:
            print(json.dumps(measure_recsys(a.one, a.k, a.recsys[0], a.calls, a.oasis_python)))
        else:
            main_recsys(a)
        return
    if a.one:
        if a.root != ROOT:  # --baseline's child: that revision's package and configs
            sys.path.insert(0, a.root)
        print(json.dumps(measure(a.one, a.ticks, a.peer, a.recsys[0], a.root)))
        return
    import numpy as np
    baseline = _baseline_tree(a.baseline) if a.baseline else None
    rows = []
    try:
        for i, (n, rs) in enumerate((n, rs) for n in a.sizes for rs in a.recsys):
            row = _one(n, rs, a.ticks, peer=i == 0 and n <= 20_000)  # dense peer: 4 N^2 bytes
            if baseline:
                b = _one(n, rs, a.ticks, peer=False, root=baseline)
                row["baseline"] = {"revision": a.baseline, **b}
            rows.append(row)
            _print_row(row, rows, a.recsys)
    finally:
        if baseline:
            subprocess.run(["git", "worktree", "remove", "--force", baseline], cwd=ROOT,
                           capture_output=True)
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
    for k in ("cascades_s", "polarisation_s"):
        if k in last:
            figures[k] = last[k]
    if "baseline" in last:
        figures["baseline_revision"] = a.baseline
        figures["baseline_seconds_per_tick"] = last["baseline"]["seconds_per_tick"]
        figures["baseline_over_ours"] = (last["baseline"]["seconds_per_tick"]
                                         / last["seconds_per_tick"])
    if any("dense_recsys_s" in r for r in all_rows):
        figures["peer"] = DENSE_PEER
    finish("society_scale", figures, record=not a.no_record)


def _baseline_tree(rev: str) -> str:
    """A temporary detached git worktree of `rev` (removed after the run)."""
    import tempfile
    path = os.path.join(tempfile.mkdtemp(prefix="society_scale_baseline_"), "tree")
    res = subprocess.run(["git", "worktree", "add", "--detach", path, rev], cwd=ROOT,
                         capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"--baseline={rev!r}: git worktree add failed: {res.stderr.strip()}")
    return path


def _one(n: int, rs: str, ticks: int, peer: bool, root: str = ROOT) -> dict:
    """One size and recommender in its own process (peak RSS per size); `root`: the code."""
    cmd = [sys.executable, __file__, "--one", str(n), "--ticks", str(ticks), "--recsys", rs,
           "--root", root] + (["--peer"] if peer else [])
    env = dict(os.environ, PYTHONPATH=root)
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
    if res.returncode != 0:
        sys.exit(f"n={n} recsys={rs} ({root}) failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _print_row(row: dict, rows: list, recsys: list) -> None:
    n, rs = row["n"], row["recsys"]
    inst = "".join(f", {k[:-2]} {row[k]:.3f} s" for k in ("cascades_s", "polarisation_s")
                   if k in row)
    print(f"n={n:>9,d} recsys={rs:<7s} active={row['active']:>7,d} "
          f"actions={row['actions']:>8,d} seconds_per_tick={row['seconds_per_tick']:.4f} "
          f"(first tick incl. compile {row['first_tick_s']:.1f} s, reset {row['reset_s']:.1f}"
          f" s, metrics {row['metrics_s']:.3f} s{inst}) peak_rss_gb={row['peak_rss_gb']:.2f}",
          flush=True)
    if "baseline" in row:
        b = row["baseline"]
        print(f"  baseline {b['revision']}: seconds_per_tick={b['seconds_per_tick']:.4f}; "
              f"baseline / ours = {b['seconds_per_tick'] / row['seconds_per_tick']:.3f}",
              flush=True)
    if "dense_recsys_s" in row:
        print(f"  peer at n={n:,d} ({DENSE_PEER}): dense users x posts recsys alone "
              f"{row['dense_recsys_s']:.4f} s; our whole tick / dense recsys = "
              f"{row['seconds_per_tick'] / row['dense_recsys_s']:.3f}", flush=True)
    if rs == recsys[-1] and len(recsys) > 1:
        base = rows[-len(recsys)]
        print(f"  n={n:,d} seconds_per_tick / {recsys[0]}'s: " + " ".join(
            f"{r['recsys']}={r['seconds_per_tick'] / base['seconds_per_tick']:.2f}"
            for r in rows[-len(recsys):]), flush=True)


if __name__ == "__main__":
    main()
