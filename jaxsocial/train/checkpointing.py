"""Orbax checkpoints of a whole run (train state, society, rng, epoch) and preemption handling.

A checkpoint at step k holds everything needed to continue exactly as if the run had not
stopped after epoch k: the TrainState (policy, value, reference, optimizer, KL, rng), the
society state, the loop's PRNG key and a small JSON of host-side metadata. The last
`keep` checkpoints are kept.

Every checkpoint is verified on restore: at save, a checksum of every array's bytes
(`tree_checksums`, computed on device, so it works for sharded multi-host arrays too) goes
into the JSON metadata; after restore the checksums are recomputed and compared. A checkpoint
that cannot be read (truncated or missing files) or whose checksums differ is moved aside to
`workdir/checkpoints_corrupt/<step>` with a warning naming it, and the next older one is
tried (`restore_latest_good`). Weights are never restored silently corrupt.

SIGTERM and SIGINT (`PreemptionGuard`): during the epoch loop they set a flag; the loop saves and
exits 0 at the next epoch boundary. Before the loop (set-up, restore) nothing new exists to save, so
with `immediate=True` the handler raises `Preempted` at once and the run exits 0.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

CHECKSUM_KEY = "checksums"


class Preempted(BaseException):
    """SIGTERM or SIGINT arrived while nothing new was there to save (set-up, restore)."""


class CheckpointError(RuntimeError):
    """No checkpoint of the workdir could be restored (each failure is named)."""


def _bits(x: jax.Array) -> jax.Array:
    """The array's bit patterns as uint32 (one per element)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = x.dtype.itemsize
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if size == 2:
        return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    if size == 1:
        return jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
    if size == 8:  # x64: both halves
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(x.shape + (2,))
    raise TypeError(f"cannot checksum dtype {x.dtype}")


_CHUNK = 1 << 20  # elements summed at a time: the checksum's temporaries stay a few MB


def _weighted_sums(u: jax.Array, start) -> jax.Array:
    """[2] uint32 sums of `u` [n] and of its elements weighted by their positions from `start`."""
    pos = ((jnp.arange(u.shape[0], dtype=jnp.uint32) + jnp.asarray(start).astype(jnp.uint32))
           * jnp.uint32(2654435761) + jnp.uint32(1))
    return jnp.stack([jnp.sum(u, dtype=jnp.uint32), jnp.sum(u * pos, dtype=jnp.uint32)])


@jax.jit
def _leaf_checksum(x: jax.Array) -> jax.Array:
    """[2] uint32: the sum of the bit patterns and a position-weighted sum (mod 2^32).

    Integer sums are exact, so the value does not depend on the sharding, the reduction order
    or the chunking; flipping any bits of one element changes the first sum, and moving or
    swapping elements changes the second. Summed a chunk at a time in a loop: XLA would
    otherwise materialise the bit patterns and the positions of the whole leaf (twice a
    checkpoint's size in temporaries at the save)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    flat = x.reshape(-1)  # the bits are taken a chunk at a time: the leaf is not copied
    whole = flat.shape[0] // _CHUNK * _CHUNK

    per = 2 if x.dtype.itemsize == 8 else 1  # 64-bit elements count as two uint32 words

    def chunk(i, acc):
        at = i * _CHUNK
        words = _bits(jax.lax.dynamic_slice(flat, (at,), (_CHUNK,))).reshape(-1)
        return acc + _weighted_sums(words, at * per)

    acc = jnp.zeros(2, jnp.uint32)
    if whole:
        acc = jax.lax.fori_loop(0, whole // _CHUNK, chunk, acc)
    return acc + _weighted_sums(_bits(flat[whole:]).reshape(-1), whole * per)


def tree_checksums(tree: Any) -> Dict[str, List[int]]:
    """{leaf path: [sum, weighted sum]} over every array leaf of `tree` (shape and dtype too).

    One leaf at a time (one small program per leaf shape, each waited for), so the temporaries
    are a chunk's."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    # Each leaf's sums fetched before the next leaf's program starts: on the CPU's fake
    # devices, several sharded programs in flight at once can deadlock in their all-reduce.
    sums = [jax.device_get(_leaf_checksum(leaf)) for _, leaf in flat]
    out = {}
    for (path, leaf), c in zip(flat, sums):
        out[jax.tree_util.keystr(path)] = (np.asarray(c).astype(np.int64).tolist()
                                           + [list(np.shape(leaf)), str(leaf.dtype)])
    return out


def checksum_mismatches(tree: Any, expected: Dict[str, list]) -> List[str]:
    """Leaf paths of `tree` whose checksum differs from `expected` (missing ones included)."""
    got = tree_checksums(tree)
    bad = [k for k in sorted(set(got) | set(expected)) if got.get(k) != expected.get(k)]
    return bad


def _path_shapes(tree: Any) -> Dict[Tuple[str, ...], Tuple[int, ...]]:
    def name(k):
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)
    return {tuple(name(k) for k in path): tuple(getattr(leaf, "shape", ()))
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _is_disk_full(e: BaseException) -> bool:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e):
            return True
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return False


def _one_line(e: BaseException, limit: int = 300) -> str:
    """The reason `e` gives, in one line: the innermost exception of its chain that says
    something (orbax wraps TensorStore's own message, e.g. "OUT_OF_RANGE: ... Requested byte
    range ... is not valid for value of size 1000", in a generic one), without the repr of
    bound methods or objects that some wrappers append."""
    chain, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    texts = []
    for x in reversed(chain):  # innermost first
        text = str(x).split("See full TensorStore details")[0]
        text = " ".join(re.sub(r"<[^<>]*(?:bound method|object at 0x)[^<>]*>?", "",
                               text).split()).rstrip(" .:")
        if text:
            texts.append(f"{type(x).__name__}: {text}")
    text = texts[0] if texts else type(chain[-1]).__name__
    return text if len(text) <= limit else text[:limit] + "..."


class Checkpointer:
    """Save/restore `(state_tree, meta_json)` pairs under `workdir/checkpoints/<step>`."""

    def __init__(self, workdir: str, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.workdir = os.path.abspath(workdir)
        self.directory = os.path.join(self.workdir, "checkpoints")
        self.corrupt_directory = os.path.join(self.workdir, "checkpoints_corrupt")
        self._keep = keep
        self._manager = self._make_manager()

    def _make_manager(self):
        options = ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True)
        return ocp.CheckpointManager(self.directory, options=options)

    @property
    def latest_step(self) -> Optional[int]:
        return self._manager.latest_step()

    def all_steps(self):
        return list(self._manager.all_steps())

    def save(self, step: int, tree: Any, meta: dict) -> None:
        """Blocking save (a run that exits right after must find a complete checkpoint).

        The meta JSON gets the arrays' checksums under "checksums". A full disk raises
        OSError(ENOSPC) with one line naming the checkpoint (the partial one is removed)."""
        meta = dict(meta, **{CHECKSUM_KEY: tree_checksums(tree)})
        try:
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)), force=True)
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 -- re-raised as one line
            logging.info("saving checkpoint %d failed", step, exc_info=True)
            self._remove_partial(step)
            if _is_disk_full(e):
                raise OSError(errno.ENOSPC, f"no space left on device while saving checkpoint "
                                            f"{step} to {self.directory}") from e
            raise OSError(f"saving checkpoint {step} to {self.directory} failed: "
                          f"{_one_line(e)}") from e
        logging.info("saved checkpoint %d to %s", step, self.directory)

    def _remove_partial(self, step: int) -> None:
        if jax.process_index() != 0:
            return
        for name in os.listdir(self.directory) if os.path.isdir(self.directory) else ():
            if name.startswith(f"{step}.orbax-checkpoint-tmp"):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def restore(self, like: Any, step: Optional[int] = None,
                verify: bool = True) -> Tuple[Any, dict, int]:
        """Restore step (default latest) into the structure/dtypes/shardings of `like`.

        Returns (tree, meta, step). Raises FileNotFoundError when there is no checkpoint,
        CheckpointError when the checkpoint is unreadable or its checksums differ (verify;
        checkpoints written before checksums existed are accepted with a warning)."""
        step = self.latest_step if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        where = os.path.join(self.directory, str(step))
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        self._check_structure(where, like)
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
            tree, meta = out.state, dict(out.meta)
        except Exception as e:  # noqa: BLE001 -- any read failure means "unreadable"
            logging.info("restoring checkpoint %s failed", where, exc_info=True)
            raise CheckpointError(f"checkpoint {where} is unreadable ({_one_line(e)})") from e
        if verify:
            expected = meta.pop(CHECKSUM_KEY, None)
            if expected is None:
                logging.warning("checkpoint %s has no checksums (written by an older version): "
                                "not verified", where)
            else:
                bad = checksum_mismatches(tree, expected)
                if bad:
                    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3
                                                  else "")
                    raise CheckpointError(f"checkpoint {where} is corrupt: checksum mismatch in "
                                          f"{len(bad)} array(s) ({shown})")
        return tree, meta, step

    def _check_structure(self, where: str, like: Any) -> None:
        """CheckpointError if the stored tree metadata is unreadable; ValueError (not a
        corruption: nothing is set aside) if it holds other arrays/shapes than `like`."""
        try:
            with ocp.StandardCheckpointer() as reader:
                md = reader.metadata(os.path.join(where, "state"))
            stored = _path_shapes(getattr(md, "item_metadata", md))
        except Exception as e:  # noqa: BLE001
            logging.info("reading the metadata of checkpoint %s failed", where, exc_info=True)
            raise CheckpointError(f"checkpoint {where} is unreadable ({_one_line(e)})") from e
        if not stored:  # orbax reads a deleted _METADATA as "no arrays", not as an error
            raise CheckpointError(f"checkpoint {where} is unreadable (its tree metadata, "
                                  f"state/_METADATA, is missing or empty)")
        wanted = _path_shapes(like)
        if stored != wanted:
            diff = sorted(set(stored.items()) ^ set(wanted.items()))
            names = sorted({"/".join(p) for p, _ in diff})
            raise ValueError(
                f"checkpoint {where} holds a different state structure than this run "
                f"({len(names)} differing arrays, e.g. {', '.join(names[:3])}): it was written "
                f"by another config or code version; use a new --workdir or --noresume")

    def restore_latest_good(self, like: Any) -> Tuple[Any, dict, int]:
        """Restore the newest checkpoint that reads back and verifies.

        A bad one gets a warning naming it and is moved to `checkpoints_corrupt/` (kept for
        inspection, out of orbax's way); then the next older one is tried. Raises
        FileNotFoundError when there is no checkpoint and CheckpointError (naming every
        failure) when none is good."""
        failures = []
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        for step in steps:
            try:
                return self.restore(like, step)
            except CheckpointError as e:
                failures.append(str(e))
                logging.warning("%s; moving it to %s and falling back to the previous "
                                "checkpoint", e, self.corrupt_directory)
                self._quarantine(step)
        raise CheckpointError("no good checkpoint: " + "; ".join(failures))

    def _quarantine(self, step: int) -> None:
        if jax.process_index() == 0:
            os.makedirs(self.corrupt_directory, exist_ok=True)
            dest = os.path.join(self.corrupt_directory, str(step))
            if os.path.exists(dest):
                shutil.rmtree(dest, ignore_errors=True)
            shutil.move(os.path.join(self.directory, str(step)), dest)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"quarantine checkpoint {step}")
        self._manager.close()
        self._manager = self._make_manager()  # it caches the step list

    def delete_all(self) -> None:
        """Delete every checkpoint (a run that starts over in the same workdir)."""
        for step in self.all_steps():
            self._manager.delete(step)
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


class PreemptionGuard:
    """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the training loop polls between epochs.

    While `immediate` is True (set-up and restore, when nothing new exists to save) the
    handler raises `Preempted` instead, so a run stopped before its first epoch exits at
    once. `signal_name` is the first stopping signal received ("SIGTERM" / "SIGINT")."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, immediate: bool = False):
        self.requested = False
        self.immediate = immediate
        self.signal_name: Optional[str] = None
        self._previous = {}

    def __enter__(self):
        def handler(signum, frame):  # noqa: ARG001
            name = signal.Signals(signum).name
            self.requested = True
            self.signal_name = self.signal_name or name
            if self.immediate:
                logging.warning("%s received before the first epoch: exiting", name)
                raise Preempted()
            logging.warning("%s received: will checkpoint and exit after this epoch", name)
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread (e.g. inside a notebook worker)
                pass
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            if previous is not None:
                signal.signal(sig, previous)
        self._previous = {}
        return False
