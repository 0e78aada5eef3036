"""The on-disk cache of the society's text banks embedded by the frozen encoder.

`embed_text` (`train.setup`) runs the encoder over a few hundred fixed texts (personas, crowd
interests, the post and comment banks) at every set-up. Those rows depend only on the encoder's
weights and its input, so they are computed once per (weights, input) and kept under
`zoo.cache_dir()/text_bank/` (`crowd_text.cache=False`: never read nor written).

An entry is one file, `<key>.rows`: a magic line, a JSON line (key, dtype, shape, sha256) and
the array's C-order bytes. It is used only when every field matches and the sha256 of the
bytes does; anything else (another key, a flipped byte, a truncated or unreadable file) is
logged in one line, recomputed and rewritten. Writes go to a temporary file renamed into place,
so a reader never sees half an entry; a cache that cannot be written (read-only, full) is
logged once and the run goes on without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Callable, Optional, Tuple

import jax
import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"jaxsocial text-bank rows v1\n"
SUFFIX = ".rows"
DTYPE = np.dtype("<f4")
# Cache directories found unwritable in this process (each is logged once).
_UNWRITABLE: set = set()


def digest(*parts) -> str:
    """sha256 hex of `parts`: numpy arrays by dtype, shape and bytes, anything else by repr."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, np.ndarray):
            h.update(repr((p.dtype.str, p.shape)).encode())
            h.update(np.ascontiguousarray(p).tobytes())
        else:
            h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def runtime() -> Tuple[str, str]:
    """(jax version, backend): what else may change the rows' last bits."""
    return jax.__version__, jax.default_backend()


def minilm_key(pins: dict, ids: np.ndarray, mask: np.ndarray) -> str:
    """Cache key of the sentence encoder's embeddings of encoder inputs ids, mask [n, Le].

    `pins` ({file: (size, sha256)}, `zoo.MINILM_PINS`) names the weights, tokenizer and
    configs by content: `zoo.minilm_l6_v2()` checks every file against them before it is read.
    Keying on the re-tokenized rows rather than the policy's covers the policy tokenizer that
    decodes them, the WordPiece tokenizer and `max_seq_length` at once. The tag ("minilm-v1",
    "pooled-v1") stands for the code: bump it when a change to the encoder's forward or
    pooling changes its output."""
    return digest("minilm-v1", sorted(pins.items()), runtime(), ids, mask)


def checkpoint_key(model_args: dict) -> str:
    """Cache key of a user checkpoint's pooled states: its files' identity (`files_key`: path,
    size, mtime; hashing gigabytes of weights at every set-up would cost what the cache saves,
    and a checkpoint rewritten in place changes its mtime) and `model_args` (dtypes, switches;
    `config.model_args`)."""
    args = dict(model_args)
    path = args.pop("path_or_preset")
    return digest("pooled-v1", files_key(path), sorted(args.items()), runtime())


def files_key(path: str) -> str:
    """Identity of a file or directory tree: (relative path, size, mtime) of every file
    under it."""
    path = os.path.abspath(path)
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs)
    return repr([(os.path.relpath(f, os.path.dirname(path)), os.path.getsize(f),
                  os.stat(f).st_mtime_ns) for f in files])


def entry_path(cache_dir: str, key: str, tokens: np.ndarray) -> str:
    """Where `cached_rows(fn, tokens, key, cache_dir)` keeps its entry."""
    return os.path.join(cache_dir, digest(key, np.asarray(tokens, np.int32)) + SUFFIX)


def cached_rows(fn: Callable[[np.ndarray], np.ndarray], tokens: np.ndarray,
                key: Optional[str], cache_dir: Optional[str]) -> np.ndarray:
    """`fn(tokens)` ([n, L] int32 -> [n, ...] float32) memoized on disk; `key` must name
    everything but `tokens` that `fn`'s output depends on (weights, dtypes, tokenizers).
    key or cache_dir None: `fn(tokens)`, no cache. A matching, intact entry is returned
    without calling `fn`; a missing one is computed and written; a mismatching, truncated or
    unreadable one is logged (one warning line), recomputed and rewritten."""
    if key is None or cache_dir is None:
        return np.asarray(fn(tokens), DTYPE)
    path = entry_path(cache_dir, key, tokens)
    name = os.path.basename(path)[:-len(SUFFIX)]
    rows, problem = read_entry(path, name, tokens.shape[0])
    if rows is not None:
        return rows
    if problem:
        log.warning("text-bank cache entry %s %s: recomputing it", path, problem)
    rows = np.asarray(fn(tokens), DTYPE)
    write_entry(path, name, rows)
    return rows


def read_entry(path: str, name: str, n: int, verify: bool = True
               ) -> Tuple[Optional[np.ndarray], str]:
    """(rows, "") from the entry at `path` when its key is `name`, it holds n rows of float32
    and (`verify`) its bytes' sha256 matches; else (None, why) with why "" for no entry."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None, ""
    except OSError as e:
        return None, f"is unreadable ({e.strerror or e})"
    if not data.startswith(MAGIC):
        return None, "is not a text-bank cache entry"
    head, sep, body = data[len(MAGIC):].partition(b"\n")
    try:
        meta = json.loads(head)
        shape, dtype, sha = tuple(meta["shape"]), np.dtype(meta["dtype"]), meta["sha256"]
    except (ValueError, KeyError, TypeError):
        return None, "has an unreadable header"
    if not sep or meta.get("key") != name or dtype != DTYPE or len(shape) < 1 \
            or shape[0] != n:
        return None, f"does not hold this key's rows (header {head[:200]!r})"
    if len(body) != int(np.prod(shape)) * DTYPE.itemsize:
        return None, (f"is truncated or padded ({len(body)} bytes of rows, expected "
                      f"{int(np.prod(shape)) * DTYPE.itemsize})")
    if verify and hashlib.sha256(body).hexdigest() != sha:
        return None, "is corrupt (sha256 of its rows does not match its header)"
    return np.frombuffer(body, DTYPE).reshape(shape).copy(), ""


def write_entry(path: str, name: str, rows: np.ndarray) -> None:
    """Write rows [n, ...] float32 as the entry `name` at `path`: a temporary file renamed into
    place. A directory that cannot be written is logged once per process; the run goes on."""
    rows = np.ascontiguousarray(rows, DTYPE)
    body = rows.tobytes()
    meta = json.dumps({"key": name, "dtype": DTYPE.str, "shape": list(rows.shape),
                       "sha256": hashlib.sha256(body).hexdigest()})
    directory = os.path.dirname(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(MAGIC + meta.encode() + b"\n" + body)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if directory not in _UNWRITABLE:
            _UNWRITABLE.add(directory)
            log.warning("text-bank cache %s cannot be written (%s): embedding without it",
                        directory, e.strerror or e)
