"""Metric writers: JSONL (one object per epoch), TensorBoard event files, text samples, progress.

`MetricWriter(workdir)` writes `metrics.jsonl` and TensorBoard events (tensorboardX, no
TensorFlow needed) side by side; `write_samples` appends qualitative samples to
`samples.jsonl`, `write_feed` one line per epoch of its posts to `feed.jsonl` (the report's
feed). Values are converted from JAX/NumPy scalars to plain floats first.

Exactly once: `cut_logs(workdir, epoch)` runs on every start (fresh or resumed) and keeps only
the records of epochs <= the restored epoch in metrics.jsonl, samples.jsonl and feed.jsonl (0
on a fresh start: all emptied), and rewrites the TensorBoard events from the kept metrics into a
fresh events directory (file suffix `.kept`, next to the new run's own file), so a step is never
shown twice. A torn last line (a run killed mid-write) is dropped with a warning naming the
file.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, Iterable, Mapping

import numpy as np
from absl import logging


def to_python(value: Any) -> Any:
    """JAX/NumPy scalars and small arrays -> JSON-friendly Python values."""
    if isinstance(value, Mapping):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    if hasattr(value, "shape"):
        arr = np.asarray(value)
        if arr.ndim == 0:
            return arr.item()
        return arr.tolist()
    return value


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> Dict[str, float]:
    """{'ppo': {'loss': 1.0}} -> {'ppo/loss': 1.0}; keeps numeric scalars only."""
    out = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            out[key] = float(v)
    return out


class MetricWriter:
    """Append-only JSONL + TensorBoard scalars in `workdir`. Use as a context manager."""

    def __init__(self, workdir: str, tensorboard: bool = True):
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")
        self._samples = open(os.path.join(workdir, "samples.jsonl"), "a", encoding="utf-8")
        self._feed = open(os.path.join(workdir, "feed.jsonl"), "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter  # 1 s to import: only where it writes
            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> Dict[str, Any]:
        record = to_python(dict(metrics))
        self._jsonl.write(json.dumps(record, sort_keys=True) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in flatten(record).items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        return record

    def write_samples(self, samples: Iterable[Mapping[str, Any]]) -> None:
        for s in samples:
            self._samples.write(json.dumps(to_python(dict(s)), ensure_ascii=False) + "\n")
        self._samples.flush()

    def write_feed(self, epoch: int, posts: Iterable[Mapping[str, Any]]) -> None:
        """One feed.jsonl line: {"epoch", "posts": [...]} (`train.host.feed`'s rows)."""
        record = {"epoch": int(epoch), "posts": to_python(list(posts))}
        self._feed.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._feed.flush()

    def close(self) -> None:
        self._jsonl.close()
        self._samples.close()
        self._feed.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def read_jsonl(path: str, strict: bool = False) -> list:
    """All records of a JSONL file (skipping blank lines).

    A line that is not valid JSON (a torn last line from a killed run) is skipped with a
    warning naming the file and line; strict=True raises ValueError naming them instead."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                msg = f"{path}:{i}: dropped an unreadable line ({e.msg}): {line.strip()[:60]!r}"
                if strict:
                    raise ValueError(msg) from None
                logging.warning(msg)
    return out


def _atomic_write_lines(path: str, lines: Iterable[str]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def cut_logs(workdir: str, epoch: int, tensorboard: bool = True) -> int:
    """Keep only records of epochs <= `epoch` in metrics.jsonl, samples.jsonl, feed.jsonl and
    interviews.jsonl, and rebuild
    the TensorBoard events from the kept metrics. Returns the number of metric records kept."""
    kept_metrics = []
    for name in ("metrics.jsonl", "samples.jsonl", "feed.jsonl", "interviews.jsonl"):
        path = os.path.join(workdir, name)
        if not os.path.exists(path):
            continue
        records = read_jsonl(path)
        kept = [r for r in records if int(r.get("epoch", 0)) <= epoch]
        if len(kept) != len(records) or _has_torn_tail(path):
            logging.info("%s: kept %d of %d records (epochs <= %d)", path, len(kept),
                         len(records), epoch)
            _atomic_write_lines(path, (json.dumps(r, sort_keys=name == "metrics.jsonl",
                                                  ensure_ascii=False) + "\n" for r in kept))
        if name == "metrics.jsonl":
            kept_metrics = kept
    tb_dir = os.path.join(workdir, "tensorboard")
    if os.path.exists(tb_dir):
        shutil.rmtree(tb_dir)
    if tensorboard and kept_metrics:
        from tensorboardX import SummaryWriter
        # Its own file-name suffix: tensorboardX names files by the second, so the writer
        # that opens next in the same second would otherwise overwrite the rebuilt events.
        with SummaryWriter(tb_dir, filename_suffix=".kept") as tb:
            for r in kept_metrics:
                for k, v in flatten(r).items():
                    tb.add_scalar(k, v, int(r["epoch"]))
    return len(kept_metrics)


def _has_torn_tail(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"
