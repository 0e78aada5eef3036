"""The text-bank embedding cache (`train.embed_cache`): a hit is the stored rows bit for bit and
skips the encoder; another key or other tokens miss; a corrupt, truncated or foreign entry is
recomputed and rewritten, never used; an unwritable cache only costs the cache."""

import errno
import logging
import os
import types

import ml_collections
import numpy as np
import pytest

from jaxsocial.models import zoo
from jaxsocial.social import text_bank
from jaxsocial.social.state import PAD_TOKEN
from jaxsocial.train import embed_cache, society_encoder
from jaxsocial.train import setup as setup_lib

TOKENS = np.arange(12, dtype=np.int32).reshape(4, 3)


class Embed:
    """A fake encoder: [n, L] int32 -> [n, 2] float32, counting its calls."""

    def __init__(self, scale=1.0):
        self.calls, self.scale = 0, scale

    def __call__(self, tokens):
        self.calls += 1
        t = tokens.astype(np.float32)
        return np.stack([np.sin(t.sum(1)) * self.scale, np.cos(t[:, 0]) / 3.0], axis=1)


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == embed_cache.__name__]


def test_hit_returns_the_stored_bits_without_the_encoder(tmp_path):
    fn, key = Embed(), embed_cache.minilm_key(zoo.MINILM_PINS, TOKENS, TOKENS > 0)
    first = embed_cache.cached_rows(fn, TOKENS, key, str(tmp_path))
    assert first.shape == (4, 2) and first.dtype == np.float32 and fn.calls == 1
    # The entry holds what fn gave; the hit returns it bit for bit without calling fn.
    again = embed_cache.cached_rows(Embed(scale=-1.0), TOKENS, key, str(tmp_path))
    np.testing.assert_array_equal(bits(again), bits(fn(TOKENS)))
    assert fn.calls == 2  # only the call just made above
    # Control: without a cache dir or key every call computes.
    for k, d in ((key, None), (None, str(tmp_path))):
        other = Embed(scale=-1.0)
        embed_cache.cached_rows(other, TOKENS, k, d)
        assert other.calls == 1


def _pins_with(name, sha):
    pins = dict(zoo.MINILM_PINS)
    pins[name] = (pins[name][0], sha)
    return pins


@pytest.mark.parametrize("change", ["weights", "tokenizer", "encoder_ids", "mask", "tokens"])
def test_another_key_or_other_tokens_miss(tmp_path, change):
    ids, mask = TOKENS + 100, TOKENS > 0
    key = embed_cache.minilm_key(zoo.MINILM_PINS, ids, mask)
    embed_cache.cached_rows(Embed(), TOKENS, key, str(tmp_path))
    tokens = TOKENS
    if change == "weights":
        key = embed_cache.minilm_key(_pins_with("model.safetensors", "0" * 64), ids, mask)
    elif change == "tokenizer":
        key = embed_cache.minilm_key(_pins_with("tokenizer.json", "1" * 64), ids, mask)
    elif change == "encoder_ids":  # e.g. another policy tokenizer or max_seq_length
        key = embed_cache.minilm_key(zoo.MINILM_PINS, ids[:, :2], mask[:, :2])
    elif change == "mask":
        key = embed_cache.minilm_key(zoo.MINILM_PINS, ids, ~mask)
    else:
        tokens = TOKENS.copy()
        tokens[3, 2] = PAD_TOKEN
    fn = Embed(scale=2.0)
    out = embed_cache.cached_rows(fn, tokens, key, str(tmp_path))
    assert fn.calls == 1
    np.testing.assert_array_equal(out, Embed(scale=2.0)(tokens))
    assert len(os.listdir(tmp_path)) == 2  # both entries kept side by side


def test_checkpoint_key_names_files_and_dtypes(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    args = dict(path_or_preset=str(ckpt), dtype="bfloat16", param_dtype=None, remat=False)
    key = embed_cache.checkpoint_key(args)
    assert embed_cache.checkpoint_key(dict(args)) == key  # control: same files, same key
    assert embed_cache.checkpoint_key(dict(args, dtype="float32")) != key
    (ckpt / "model.safetensors").write_bytes(b"weights, longer")
    assert embed_cache.checkpoint_key(args) != key


def _stored(tmp_path, key="k"):
    fn = Embed()
    good = embed_cache.cached_rows(fn, TOKENS, key, str(tmp_path))
    path = embed_cache.entry_path(str(tmp_path), key, TOKENS)
    with open(path, "rb") as f:
        return good, path, f.read()


def test_flipped_byte_is_detected_recomputed_and_rewritten(tmp_path, caplog):
    good, path, data = _stored(tmp_path)
    corrupt = bytearray(data)
    corrupt[-3] ^= 0x40  # in the last row's float bytes
    with open(path, "wb") as f:
        f.write(corrupt)
    name = os.path.basename(path)[:-len(embed_cache.SUFFIX)]
    # Negative control: read without the digest check, the corrupt rows would be used.
    raw, _ = embed_cache.read_entry(path, name, 4, verify=False)
    assert raw is not None and not np.array_equal(bits(raw), bits(good))
    fn = Embed()
    with caplog.at_level(logging.WARNING):
        out = embed_cache.cached_rows(fn, TOKENS, "k", str(tmp_path))
    assert fn.calls == 1
    np.testing.assert_array_equal(bits(out), bits(good))
    [w] = warnings_of(caplog)
    assert "corrupt" in w.getMessage() and "\n" not in w.getMessage()
    with open(path, "rb") as f:
        assert f.read() == data  # rewritten
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


REASON = {"truncated": "truncated", "empty": "not a text-bank cache entry",
          "not_an_entry": "not a text-bank cache entry", "header": "unreadable header",
          "other_key": "does not hold this key's rows", "unreadable": "unreadable (Input/output"}


@pytest.mark.parametrize("damage", ["truncated", "empty", "not_an_entry", "header",
                                    "other_key", "unreadable"])
def test_damaged_entry_is_recomputed(tmp_path, caplog, monkeypatch, damage):
    good, path, data = _stored(tmp_path)
    if damage == "unreadable":  # as a failing disk answers (chmod would not stop root)
        def failing_open(file, mode="r", *a, **k):
            if file == path and "r" in mode:
                raise OSError(errno.EIO, "Input/output error")
            return open(file, mode, *a, **k)
        monkeypatch.setattr(embed_cache, "open", failing_open, raising=False)
    else:
        other = _stored(tmp_path / "other", key="other")[2]
        damaged = {"truncated": data[:-5], "empty": b"", "not_an_entry": b"\x93NUMPY" + data,
                   "header": data.replace(b'"shape"', b'"shap"'), "other_key": other}[damage]
        with open(path, "wb") as f:
            f.write(damaged)
    fn = Embed()
    with caplog.at_level(logging.WARNING):
        out = embed_cache.cached_rows(fn, TOKENS, "k", str(tmp_path))
    [w] = warnings_of(caplog)
    assert fn.calls == 1 and REASON[damage] in w.getMessage()
    np.testing.assert_array_equal(bits(out), bits(good))
    with open(path, "rb") as f:
        assert f.read() == data  # rewritten


@pytest.mark.parametrize("how", ["not_a_directory", "read_only"])
def test_unwritable_cache_runs_without_it(tmp_path, caplog, monkeypatch, how):
    if how == "not_a_directory":
        (tmp_path / "file").write_text("x")
        cache = str(tmp_path / "file" / "text_bank")
    else:  # as a read-only filesystem answers (chmod would not stop root)
        cache = str(tmp_path / "ro")

        def replace(src, dst):
            raise OSError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(embed_cache.os, "replace", replace)
    fn = Embed()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            out = embed_cache.cached_rows(fn, TOKENS, "k", cache)
            np.testing.assert_array_equal(out, Embed()(TOKENS))
    assert fn.calls == 3  # no cache, no failure
    [w] = warnings_of(caplog)  # one line for the directory, not one per call
    assert "cannot be written" in w.getMessage()
    if how == "read_only":
        assert not [p for p in os.listdir(cache) if ".tmp" in p]


class WordTokenizer:
    """A policy tokenizer over a word list: id i decodes to words[i]."""

    def __init__(self, words):
        self.words = words

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.words[i] for i in ids)


def test_minilm_set_up_embeds_once(tmp_path, monkeypatch):
    """Through `setup.embed_text`'s MiniLM path: a cold cache embeds, a warm one gives the same
    bank bit for bit without the encoder, and a policy tokenizer that decodes the same ids to
    other text misses."""
    words = ["cooking", "pasta", "garden", "tomatoes", "chess", "openings", "travel", "trains"]
    directory = zoo.minilm_l6_v2()  # the user's copy, before JAXSOCIAL_CACHE moves
    graphdef, params, _ = society_encoder.load_minilm(None)
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path))
    P = PAD_TOKEN
    tt = setup_lib.TextTokens(
        posts=np.array([[0, 1, P], [2, 3, P], [4, 5, P]], np.int32),
        post_topic=np.array([0, 1, 2]), comments=np.array([[1, 0, P]], np.int32),
        comment_topic=np.array([0]), long=np.array([[0, 1, 2], [4, 5, 6], [6, 7, 0]], np.int32),
        interest_topic=(0, 2), desc=(0, 1), topics=("food", "garden", "games"),
        temperature=0.05, by_id=False)
    config = ml_collections.ConfigDict(dict(crowd_text=dict(cache=True)))
    calls = []
    embed_rows = text_bank.embed_rows
    monkeypatch.setattr(text_bank, "embed_rows",
                        lambda *a, **k: calls.append(1) or embed_rows(*a, **k))

    def embed(vocab):
        retok = society_encoder.Retokenizer(WordTokenizer(vocab), directory, 256, 0)
        setup = types.SimpleNamespace(text_tokens=tt, config=config, encoder=setup_lib.EncoderDef(
            kind="minilm", graphdef=graphdef, retokenizer=retok))
        text = setup_lib.embed_text(setup, setup_lib.Weights(None, None, params))
        return np.asarray(text.crowd_text.posts.embedding), np.asarray(text.agent_interest)

    cold = embed(words)
    assert len(calls) == 2 and len(os.listdir(tmp_path / "text_bank")) == 2
    warm = embed(words)
    assert len(calls) == 2  # no encoder pass
    for a, b in zip(cold, warm):
        np.testing.assert_array_equal(bits(a), bits(b))
    other = embed(words[::-1])  # same policy ids, other text
    assert len(calls) == 4 and not np.allclose(other[0], cold[0])

