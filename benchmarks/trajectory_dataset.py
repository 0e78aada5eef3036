"""A study's trajectory datasets (`train.dataset=True`): their size, the cost of writing one
epoch, and a use: a linear reward model on the posts' MiniLM embeddings -> likes.

    python benchmarks/trajectory_dataset.py runs/smol_dataset        # a study (or a run) dir

Every run directory under the given ones that holds `dataset/` is read with
`jaxsocial.datasets` (TFDS's reader, no TensorFlow). Figures:

- per run and epoch: episodes, steps, posts and bytes on disk (`runs`), and the mean bytes per
  epoch and per step;
- `write_s`: the median of 3 rewrites of the last run's last epoch with
  `jaxsocial.train.dataset.write_epoch` into a temporary directory (TensorFlow imported before:
  `import_s`, once per process), and `read_s` of the same epoch with `jaxsocial.datasets`;
- the reward model: every post (a create_post / quote_post step that created one) embedded with
  all-MiniLM-L6-v2 (the project's cached copy, `models.zoo`), its text after the action prefix;
  ridge regression (closed form, the penalty picked by 5-fold cross-validation on the training
  seeds from 1e-3..1e2) -> likes, fitted on all seeds but one and scored on the held-out seed,
  each seed held out in turn (`folds`). Beside it two peers on the same folds: the training
  mean (R^2 <= 0 by construction) and the same ridge on the post's length in words alone (does
  the embedding add anything beyond length?). Scores: R^2 and Spearman's rho on held-out likes.

Prints a line per figure, then `result: <file>` (benchmarks/results/) and the machine line.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import NO_RECORD_HELP, finish  # noqa: E402  benchmarks/: the result file

from jaxsocial import datasets  # noqa: E402
from jaxsocial.train import dataset as dataset_lib  # noqa: E402

PENALTIES = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


def run_dirs(paths):
    """Every run directory with a dataset at or under `paths`, sorted."""
    out = set()
    for p in paths:
        for d in [p] + glob.glob(os.path.join(p, "*")):
            if dataset_lib.epochs(d):
                out.add(d)
    if not out:
        raise SystemExit(f"error: no trajectory dataset under {', '.join(paths)} "
                         "(run with train.dataset=True)")
    return sorted(out)


def _du(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def ridge(x, y, lam):
    """Weights [d + 1] (the last the intercept, not penalised) of ridge regression."""
    xm, ym = x.mean(0), y.mean()
    xc = x - xm
    w = np.linalg.solve(xc.T @ xc + lam * np.eye(x.shape[1]), xc.T @ (y - ym))
    return np.append(w, ym - xm @ w)


def predict(w, x):
    return x @ w[:-1] + w[-1]


def fit(x, y, seed=0):
    """Ridge with its penalty chosen by 5-fold CV (mean squared error) on (x, y)."""
    idx = np.random.default_rng(seed).permutation(len(y))
    folds = np.array_split(idx, 5)
    best = min(PENALTIES, key=lambda lam: np.mean([
        np.mean((predict(ridge(np.delete(x, f, 0), np.delete(y, f), lam), x[f]) - y[f]) ** 2)
        for f in folds]))
    return ridge(x, y, best), best


def r2(y, p):
    return float(1 - np.sum((y - p) ** 2) / np.sum((y - y.mean()) ** 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+", help="study or run directories")
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    a = ap.parse_args()
    dirs = run_dirs(a.paths)
    runs, posts = [], []
    for d in dirs:
        for e, path in dataset_lib.epochs(d).items():
            eps = list(datasets.episodes(d, [e]))
            steps = [s for ep in eps for s in ep["steps"]]
            mine = [(ep["seed"], s) for ep in eps for s in datasets.post_steps(ep)]
            posts += [(seed, e, s["action"]["text"].split(":", 1)[-1].strip(),
                       s["engagement"]["like"]) for seed, s in mine]
            runs.append({"run": os.path.relpath(d, ROOT), "epoch": e, "episodes": len(eps),
                         "steps": len(steps), "posts": len(mine), "bytes": _du(path)})
            print(f"{runs[-1]['run']} epoch {e}: {len(eps)} episodes, {len(steps)} steps, "
                  f"{len(mine)} posts, {runs[-1]['bytes'] / 1e6:.2f} MB", flush=True)
    figures = {"runs": runs, "epochs": len(runs),
               "bytes_per_epoch": statistics.mean(r["bytes"] for r in runs),
               "bytes_per_step": sum(r["bytes"] for r in runs) / sum(r["steps"] for r in runs)}
    figures["mb_per_epoch"] = figures["bytes_per_epoch"] / 1e6
    figures["kb_per_step"] = figures["bytes_per_step"] / 1e3

    t0 = time.perf_counter()
    import tensorflow  # noqa: F401  the writer's dependency, imported once per process
    import tensorflow_datasets  # noqa: F401
    figures["import_s"] = time.perf_counter() - t0
    last, e = dirs[-1], max(dataset_lib.epochs(dirs[-1]))
    t0 = time.perf_counter()
    eps = list(datasets.episodes(last, [e]))
    figures["read_s"] = time.perf_counter() - t0
    pairs = [(f"epoch{ep['epoch']}-agent{ep['agent']}", ep) for ep in eps]
    times = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            dataset_lib.write_epoch(tmp, e, pairs)
            times.append(time.perf_counter() - t0)
    figures["write_s"] = statistics.median(times)
    figures["write_steps"] = sum(len(ep["steps"]) for ep in eps)
    print(f"per epoch {figures['mb_per_epoch']:.2f} MB ({figures['kb_per_step']:.1f} kB a step); "
          f"write {figures['write_s']:.2f} s "
          f"and read {figures['read_s']:.2f} s for {figures['write_steps']} steps; "
          f"TensorFlow import {figures['import_s']:.1f} s", flush=True)

    from jaxsocial.models import encoder, zoo
    enc = encoder.SentenceEncoder.from_pretrained(zoo.minilm_l6_v2())
    seeds = np.array([p[0] for p in posts])
    if len(set(seeds.tolist())) < 2:
        raise SystemExit("error: the reward model holds out one seed at a time: give the runs "
                         "of at least two seeds")
    likes = np.array([p[3] for p in posts], float)
    emb = np.asarray(enc.encode([p[2] for p in posts]), float)
    words = np.array([[len(p[2].split())] for p in posts], float)
    folds, scores = [], {k: {"r2": [], "spearman": []} for k in ("embedding", "length", "mean")}
    for held in sorted(set(seeds.tolist())):
        tr, te = seeds != held, seeds == held
        row = {"held_out_seed": held, "train_posts": int(tr.sum()), "test_posts": int(te.sum())}
        for name, x in (("embedding", emb), ("length", words)):
            w, lam = fit(x[tr], likes[tr])
            p = predict(w, x[te])
            row[name] = {"penalty": lam, "r2": r2(likes[te], p),
                         "spearman": float(stats.spearmanr(likes[te], p).statistic)}
        row["mean"] = {"r2": r2(likes[te], np.full(te.sum(), likes[tr].mean())),
                       "spearman": float("nan")}
        for k in scores:
            scores[k]["r2"].append(row[k]["r2"])
            scores[k]["spearman"].append(row[k]["spearman"])
        folds.append(row)
        print(f"held-out seed {held} ({row['test_posts']} posts, trained on "
              f"{row['train_posts']}): R^2 embedding {row['embedding']['r2']:.3f}, length "
              f"{row['length']['r2']:.3f}, mean {row['mean']['r2']:.3f}; Spearman embedding "
              f"{row['embedding']['spearman']:.3f}, length {row['length']['spearman']:.3f}",
              flush=True)
    figures.update({"posts": len(posts), "likes_mean": float(likes.mean()),
                    "likes_std": float(likes.std()), "folds": folds,
                    "model": "ridge on all-MiniLM-L6-v2 embeddings -> likes, leave one seed out"})
    for k, v in scores.items():
        figures[f"{k}_r2"] = float(np.mean(v["r2"]))
        if k != "mean":
            figures[f"{k}_spearman"] = float(np.mean(v["spearman"]))
    print(f"reward model, mean over held-out seeds: R^2 embedding {figures['embedding_r2']:.3f} "
          f"(length alone {figures['length_r2']:.3f}, the mean {figures['mean_r2']:.3f}); "
          f"Spearman embedding {figures['embedding_spearman']:.3f} "
          f"(length {figures['length_spearman']:.3f})")
    finish("trajectory_dataset", figures, record=not a.no_record,
           argv=["benchmarks/trajectory_dataset.py", *a.paths])


if __name__ == "__main__":
    main()
