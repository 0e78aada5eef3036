"""Metric writers: JSONL (one object per epoch), TensorBoard event files, text samples, progress.

`MetricWriter(workdir)` writes `metrics.jsonl` and TensorBoard events (tensorboardX, no
TensorFlow needed) side by side; `write_samples` appends qualitative samples to
`samples.jsonl`. Values are converted from JAX/NumPy scalars to plain floats first.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, Mapping

import numpy as np


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
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter
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

    def close(self) -> None:
        self._jsonl.close()
        self._samples.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def read_jsonl(path: str) -> list:
    """All records of a JSONL file (skipping blank lines)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
