"""Run reports: text-drift indicators of the agents' posts and the human-readable summary.md.

The blog's worry under reward hacking is that agents learn to attract attention rather than to
say something: posts get shorter or longer, more uniform, more hashtags / exclamation marks /
emoji, and agents converge on the same few posts. `text_drift(texts, authors)` measures exactly
those on one epoch's posts (host side, on decoded text); the loop logs them per epoch in
metrics.jsonl under `drift/`, and `write_summary_md` puts first vs last epoch beside the blog's
engagement table and a few real posts.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

_WORD = re.compile(r"\w+(?:'\w+)?", re.UNICODE)
_HASHTAG = re.compile(r"#\w+", re.UNICODE)
# Pictographic emoji blocks (and the dingbats/symbols block commonly used as emoji).
_EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\U0001F900-\U0001F9FF]")

DRIFT_KEYS = ("mean_post_words", "distinct_2", "hashtag_share", "exclamation_share",
              "emoji_share", "near_duplicate_share")


def _words(text: str) -> List[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _shingles(words: Sequence[str], n: int = 3) -> frozenset:
    if len(words) < n:
        return frozenset([tuple(words)]) if words else frozenset()
    return frozenset(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def text_drift(texts: Sequence[str], authors: Optional[Sequence[int]] = None,
               near_dup_threshold: float = 0.8) -> Dict[str, float]:
    """Text-drift indicators of one epoch's posts.

    texts: the posts' decoded text; authors: the posting agent of each (default: all different).
    Returns mean_post_words, distinct_2 (unique word bigrams / all bigrams), the shares of posts
    with a hashtag / an exclamation mark / an emoji, and near_duplicate_share: the share of
    posts whose word-trigram Jaccard similarity to a post by a *different* agent is
    >= near_dup_threshold (agents converging on one text). All 0.0 for no posts.
    """
    n = len(texts)
    if authors is None:
        authors = list(range(n))
    if len(authors) != n:
        raise ValueError(f"text_drift: {n} texts but {len(authors)} authors")
    if n == 0:
        return {k: 0.0 for k in DRIFT_KEYS}
    words = [_words(t) for t in texts]
    bigrams = [tuple(w[i:i + 2]) for w in words for i in range(len(w) - 1)]
    shingles = [_shingles(w) for w in words]
    dup = 0
    for i in range(n):
        for j in range(n):
            if i == j or authors[i] == authors[j] or not shingles[i] or not shingles[j]:
                continue
            a, b = shingles[i], shingles[j]
            if len(a & b) / len(a | b) >= near_dup_threshold:
                dup += 1
                break
    return {
        "mean_post_words": sum(len(w) for w in words) / n,
        "distinct_2": len(set(bigrams)) / len(bigrams) if bigrams else 0.0,
        "hashtag_share": sum(bool(_HASHTAG.search(t)) for t in texts) / n,
        "exclamation_share": sum("!" in t for t in texts) / n,
        "emoji_share": sum(bool(_EMOJI.search(t)) for t in texts) / n,
        "near_duplicate_share": dup / n,
    }


_TABLE = (("avg_likes_per_post", "avg likes per post", "{:.4f}"),
          ("zero_like_share", "zero-like share", "{:.4f}"),
          ("positive_engagement_share", "positive-engagement share", "{:.4f}"),
          ("total_posts", "total posts", "{:d}"))


def _fmt(fmt: str, v: Any) -> str:
    if v is None:
        return "-"
    try:
        return fmt.format(int(v) if fmt == "{:d}" else float(v))
    except (TypeError, ValueError):
        return str(v)


def summary_markdown(summary: Mapping[str, Any], title: str = "Social-RL run") -> str:
    """summary.md text: the blog's engagement table (first vs last epoch), the text-drift
    indicators, and up to three real posts from the first and the last epoch.

    `summary` is runner.train's summary dict: `first` / `last` are history records (the keys of
    `_TABLE`, optional `drift` dict and `posts` list of {"text", "likes"})."""
    first, last = summary.get("first"), summary.get("last")
    lines = [f"# {title}", ""]
    if not first:
        return "\n".join(lines + ["No epochs were run.", ""])
    e0, e1 = first.get("epoch"), last.get("epoch")
    lines += [f"| metric | epoch {e0} | epoch {e1} |", "|---|---:|---:|"]
    for key, name, fmt in _TABLE:
        lines.append(f"| {name} | {_fmt(fmt, first.get(key))} | {_fmt(fmt, last.get(key))} |")
    c0, c1 = first.get("cohorts") or {}, last.get("cohorts") or {}
    if c0 or c1:  # agents.cohorts: the same table per cohort, and who likes whom
        lines += ["", "## Cohorts", "", f"| cohort | metric | epoch {e0} | epoch {e1} |",
                  "|---|---|---:|---:|"]
        for name in c1 or c0:
            a, b = c0.get(name) or {}, c1.get(name) or {}
            for key, label, fmt in _TABLE + (("total_likes", "total likes", "{:d}"),):
                if key in a or key in b:
                    lines.append(f"| {name} | {label} | {_fmt(fmt, a.get(key))} | "
                                 f"{_fmt(fmt, b.get(key))} |")
            given = b.get("likes_given") or {}
            if given:
                lines.append(f"| {name} | likes given (epoch {e1}) | | " + ", ".join(
                    f"{k} {v}" for k, v in given.items()) + " |")
    d0, d1 = first.get("drift") or {}, last.get("drift") or {}
    if d0 or d1:
        lines += ["", "## Text drift (reward-hacking indicators)", "",
                  f"| indicator | epoch {e0} | epoch {e1} |", "|---|---:|---:|"]
        for k in DRIFT_KEYS:
            lines.append(f"| {k} | {_fmt('{:.4f}', d0.get(k))} | {_fmt('{:.4f}', d1.get(k))} |")
    for label, rec in (("first", first), ("last", last)):
        posts = rec.get("posts") or []
        lines += ["", f"## Posts from the {label} epoch (epoch {rec.get('epoch')})", ""]
        if not posts:
            lines.append("(no posts)")
        for p in posts[:3]:
            text = " ".join(str(p.get("text", "")).split()) or "(empty)"
            lines.append(f"- ({p.get('likes', 0)} likes) {text}")
    interviews = summary.get("interviews") or {}
    pairs = [("first", interviews.get("first") or [])]
    if interviews.get("last") and interviews.get("last") != interviews.get("first"):
        pairs.append(("last", interviews["last"]))
    for label, answers in pairs if interviews else ():
        if not answers:
            continue
        lines += ["", f"## Interview, {label} (epoch {answers[0].get('epoch')}): "
                      f"{answers[0].get('question', '')}", ""]
        for r in answers:
            text = " ".join(str(r.get("answer", "")).split()) or "(empty)"
            lines.append(f"- agent {r.get('agent')}: {text}")
    return "\n".join(lines) + "\n"


def write_summary_md(summary: Mapping[str, Any], path: str, title: str = "Social-RL run") -> None:
    """Write `summary_markdown(summary)` to `path`."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(summary_markdown(summary, title))


_BARS = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"


def sparkline(values: Sequence[float]) -> str:
    """One block character per value, scaled between the smallest and the largest."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo
    return "".join(_BARS[0 if span == 0 else min(len(_BARS) - 1,
                                                 int((v - lo) / span * len(_BARS)))]
                   for v in values)


def console_story(summary: dict, workdir: str, non_post_mode: str = "constant",
                  max_rows: int = 12, random_model: bool = False) -> str:
    """What the end of a run prints: the per-epoch trend (avg likes per post, zero-like share,
    posts; a sparkline), the best post of the first epoch and the best and worst of the last
    with their likes (with a word on why they are noise when the model is random), the non-post
    rule when it is on, and the paths of what the run wrote."""
    history = summary.get("history") or []
    if not history:
        return "no epochs run"
    rows = history if len(history) <= max_rows else history[:2] + [None] + \
        history[-(max_rows - 3):]
    lines = ["epoch  likes/post  zero-like  posts"]
    for h in rows:
        lines.append("  ...      ...        ...    ..." if h is None else
                     f"{h['epoch']:>5}  {h['avg_likes_per_post']:>10.3f}  "
                     f"{h['zero_like_share']:>9.3f}  {h['total_posts']:>5}")
    likes = [h["avg_likes_per_post"] for h in history]
    lines.append(f"likes/post by epoch: {sparkline(likes)}  ({likes[0]:.3f} -> {likes[-1]:.3f})")
    first, last = history[0], history[-1]
    shown = [("best", first, (first.get("posts") or [None])[0])] if len(history) > 1 else []
    shown += [("best", last, (last.get("posts") or [None])[0]),
              ("worst", last, last.get("worst_post"))]
    for label, h, post in shown:
        if post is not None:
            text = " ".join(str(post["text"]).split())
            text = text if len(text) <= 100 else text[:97] + "..."
            lines.append(f"{label} post of epoch {h['epoch']} ({post['likes']} likes): "
                         f"{text!r}")
    if random_model:
        lines.append("(a randomly initialised model writes byte noise: the posts are meant to "
                     "look like this; configs/smol.py runs a real pretrained model)")
    if non_post_mode == "mean":
        lines.append("answers that create nothing (like, nothing, ...) are scored with the "
                     "epoch's mean post score (reward.non_post_mode='mean')")
    elif non_post_mode == "skip":
        lines.append("answers that create nothing (like, nothing, ...) are left out of the "
                     "update (reward.non_post_mode='skip')")
    files = [n for n in ("report.html", "summary.md", "summary.json", "metrics.jsonl",
                         "samples.jsonl", "feed.jsonl", "tensorboard", "export", "initial",
                         "train.log")
             if os.path.exists(os.path.join(workdir, n))]
    lines.append(f"wrote {workdir}/: " + ", ".join(
        n + ("/" if os.path.isdir(os.path.join(workdir, n)) else "") for n in files))
    return "\n".join(lines)
