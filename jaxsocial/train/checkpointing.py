"""Orbax checkpoints of a whole run (train state, society, rng, epoch) and preemption handling.

A checkpoint at step k holds everything needed to continue exactly as if the run had not
stopped after epoch k: the TrainState (policy, value, reference, optimizer, KL, rng), the
society state, the loop's PRNG key and a small JSON of host-side metadata. The last
`keep` checkpoints are kept. SIGTERM sets a flag; the loop saves and exits 0 at the next epoch
boundary (`PreemptionGuard`).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Optional, Tuple

import jax
import orbax.checkpoint as ocp
from absl import logging


class Checkpointer:
    """Save/restore `(state_tree, meta_json)` pairs under `workdir/checkpoints/<step>`."""

    def __init__(self, workdir: str, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    @property
    def latest_step(self) -> Optional[int]:
        return self._manager.latest_step()

    def all_steps(self):
        return list(self._manager.all_steps())

    def save(self, step: int, tree: Any, meta: dict) -> None:
        """Blocking save (a run that exits right after must find a complete checkpoint)."""
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)), force=True)
        self._manager.wait_until_finished()
        logging.info("saved checkpoint %d to %s", step, self.directory)

    def restore(self, like: Any, step: Optional[int] = None) -> Tuple[Any, dict, int]:
        """Restore into the structure/dtypes/shardings of `like` (a tree of arrays).

        Returns (tree, meta, step). Raises FileNotFoundError when there is no checkpoint.
        """
        step = self.latest_step if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out.state, dict(out.meta), step

    def close(self) -> None:
        self._manager.close()


class PreemptionGuard:
    """Turns SIGTERM into a flag the training loop polls between epochs."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        def handler(signum, frame):  # noqa: ARG001
            logging.warning("SIGTERM received: will checkpoint and exit after this epoch")
            self.requested = True
        try:
            self._previous = signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread (e.g. inside a notebook worker)
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False
