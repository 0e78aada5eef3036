"""The Flax NNX Llama against transformers' PyTorch LlamaForCausalLM, plus its own invariants.

Weights always take the real path: a random transformers model -> its `save_pretrained`
directory -> our `checkpoint_hf.from_pretrained`.
"""

import functools

import hf_utils
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import jaxpr_shapes
from flax import nnx

from jaxsocial.models import checkpoint_hf, llama

B, T = 3, 24
ATOL = 1e-4

CASES = {
    "multi_head": dict(),
    "gqa_llama3_rope": dict(num_key_value_heads=2, rope_theta=10000.0,
                            rope_scaling=hf_utils.LLAMA3_ROPE_SCALING),
    "tied": dict(tie_word_embeddings=True, num_key_value_heads=2),
    "head_dim_16": dict(head_dim=16, num_key_value_heads=1),
}


def _ids(seed, shape, vocab=hf_utils.TINY_HF_CONFIG["vocab_size"]):
    return np.random.RandomState(seed).randint(3, vocab, shape).astype(np.int32)


def _left_padded_mask():
    mask = np.ones((B, T), bool)
    mask[1, :5] = False
    mask[2, :11] = False
    return mask


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (HF dir, PyTorch model) for every CASE."""
    out = {}
    for i, (name, overrides) in enumerate(CASES.items()):
        path = tmp_path_factory.mktemp(name)
        out[name] = (path, hf_utils.save_random_hf_model(path, seed=i, **overrides))
    return out


@pytest.fixture(scope="module")
def gqa(checkpoints):
    """(our model, PyTorch model) for the GQA + llama3-rope case."""
    path, hf = checkpoints["gqa_llama3_rope"]
    return checkpoint_hf.from_pretrained(path), hf


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(checkpoints, name):
    path, hf = checkpoints[name]
    model = checkpoint_hf.from_pretrained(path)
    cfg = model.config
    assert cfg.tie_word_embeddings == CASES[name].get("tie_word_embeddings", False)
    assert (model.lm_head is None) == cfg.tie_word_embeddings
    if "head_dim" in CASES[name]:
        assert cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size
    ids = _ids(1, (B, T))
    ref = hf_utils.hf_logits(hf, ids)
    ours = hf_utils.our_logits(model, ids)
    assert ours.shape == ref.shape == (B, T, cfg.vocab_size) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)
    # The comparison is sensitive: random weights give logits of a visible size.
    assert np.abs(ref).max() > 1e-2


@pytest.mark.parametrize("change", [dict(rope_scaling=None), dict(rope_theta=500000.0)])
def test_parity_is_sensitive_to_rope(gqa, change):
    """Control for the parity test: the wrong rope scaling or theta must break parity."""
    model, hf = gqa
    ids = _ids(2, (1, T))
    ref = hf_utils.hf_logits(hf, ids)
    right = model.config
    model.config = right.replace(**change)
    try:
        wrong = hf_utils.our_logits(model, ids)
    finally:
        model.config = right
    assert np.abs(wrong - ref).max() > 100 * ATOL
    np.testing.assert_allclose(hf_utils.our_logits(model, ids), ref, atol=ATOL, rtol=0)


def test_left_padded_batch_matches_each_sequence_alone(gqa):
    model, hf = gqa
    ids, mask = _ids(3, (B, T)), _left_padded_mask()
    out = model.forward(jnp.asarray(ids), jnp.asarray(mask))
    batch = np.asarray(out.logits)
    assert out.hidden.shape == (B, T, model.config.hidden_size)
    # transformers with the same positions (cumsum(mask) - 1) agrees on every real token.
    ref = hf_utils.hf_logits(hf, ids, mask)
    np.testing.assert_allclose(batch[mask], ref[mask], atol=ATOL, rtol=0)
    for row in range(B):
        real = ids[row][mask[row]][None]
        alone = hf_utils.our_logits(model, real)[0]
        np.testing.assert_allclose(batch[row][mask[row]], alone, atol=1e-5, rtol=0)
        np.testing.assert_allclose(alone, hf_utils.hf_logits(hf, real)[0], atol=ATOL, rtol=0)


def _scanned(model):
    """A copy of `model` whose config runs the layers as one lax.scan (same weights)."""
    copy = nnx.merge(*nnx.split(model))
    copy.config = copy.config.replace(scan_layers=True)
    return copy


@pytest.mark.parametrize("scan", [False, True])
def test_cache_prefill_then_decode_matches_full_forward(gqa, scan):
    model, _ = gqa
    model = _scanned(model) if scan else model
    cfg = model.config
    ids, mask = _ids(4, (B, T)), _left_padded_mask()
    full = model.forward(jnp.asarray(ids), jnp.asarray(mask))

    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, ids, mask, cache):
        out = nnx.merge(graphdef, state).forward(ids, mask, cache=cache)
        return out.logits, out.hidden, out.cache

    prefill = 16
    cache = llama.init_cache(cfg, B, T + 4)
    logits, hidden, cache = step(state, jnp.asarray(ids[:, :prefill]),
                                 jnp.asarray(mask[:, :prefill]), cache)
    pieces, hiddens = [logits], [hidden]
    # A 3-token chunk (another trace) then one token at a time (one trace, reused).
    chunks = [(prefill, prefill + 3)] + [(t, t + 1) for t in range(prefill + 3, T)]
    for a, b in chunks:
        logits, hidden, cache = step(state, jnp.asarray(ids[:, a:b]), jnp.asarray(mask[:, a:b]),
                                     cache)
        pieces.append(logits)
        hiddens.append(hidden)
    assert step._cache_size() == 3
    inc = np.concatenate([np.asarray(p) for p in pieces], axis=1)
    inc_hidden = np.concatenate([np.asarray(h) for h in hiddens], axis=1)
    np.testing.assert_allclose(inc[mask], np.asarray(full.logits)[mask], atol=1e-5, rtol=0)
    np.testing.assert_allclose(inc_hidden[mask], np.asarray(full.hidden)[mask], atol=1e-5,
                               rtol=0)
    assert int(cache.index) == T
    np.testing.assert_array_equal(np.asarray(cache.lengths), mask.sum(1))
    np.testing.assert_array_equal(np.asarray(cache.mask)[:, :T], mask)
    assert not np.asarray(cache.mask)[:, T:].any()
    # Unwritten slots are untouched; a scanned model keeps one stacked [L, ...] buffer.
    assert isinstance(cache.k, tuple) != scan
    assert np.asarray(cache.k).shape == (cfg.num_hidden_layers, B, T + 4,
                                         cfg.num_key_value_heads, cfg.head_dim)
    assert not np.asarray(cache.k)[:, :, T:].any()


@pytest.mark.parametrize("scan", [False, True])
def test_kv_limit_attends_the_live_prefix_only(gqa, scan):
    """Chunks that attend only to the slots filled so far (kv_limit = slots after the write)
    give the full forward's logits; 8 spare slots past T are never read. Negative control: a
    kv_limit that cuts off live slots (unchecked under jit, where the index is traced)
    changes the logits, so the limit is really applied."""
    model, _ = gqa
    model = _scanned(model) if scan else model
    ids, mask = _ids(6, (B, T)), _left_padded_mask()
    full = np.asarray(model.forward(jnp.asarray(ids), jnp.asarray(mask)).logits)
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnums=(4,))
    def step(state, ids, mask, cache, kv_limit):
        out = nnx.merge(graphdef, state).forward(ids, mask, cache=cache, kv_limit=kv_limit)
        return out.logits, out.cache

    cache = llama.init_cache(model.config, B, T + 8)
    pieces = []
    for a, b in [(0, 8), (8, 16)] + [(t, t + 1) for t in range(16, T)]:
        if a == 8:
            cut, _ = step(state, jnp.asarray(ids[:, a:b]), jnp.asarray(mask[:, a:b]), cache, 4)
            assert np.abs(np.asarray(cut) - full[:, a:b])[mask[:, a:b]].max() > 1e-2
        logits, cache = step(state, jnp.asarray(ids[:, a:b]), jnp.asarray(mask[:, a:b]), cache,
                             b)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, 1)[mask], full[mask], atol=1e-5, rtol=0)
    assert int(cache.index) == T


@pytest.mark.parametrize("index, t, kv_limit, match", [
    (0, 2, 9, "kv_limit must be in \\[1, 8\\].*got 9"),
    (0, 2, 0, "kv_limit must be in \\[1, 8\\].*got 0"),
    (4, 2, 5, "kv_limit 5 < 4 slots used \\+ 2 new tokens"),
    (None, 2, 4, "kv_limit needs a cache")])
def test_bad_kv_limit_is_an_error(gqa, index, t, kv_limit, match):
    model, _ = gqa
    cache = (None if index is None else
             llama.init_cache(model.config, 1, 8).replace(index=jnp.int32(index)))
    ids = jnp.ones((1, t), jnp.int32)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(lambda: model.forward(ids, cache=cache, kv_limit=kv_limit))
    if cache is not None:  # the limit that fits is accepted
        jax.eval_shape(lambda: model.forward(ids, cache=cache, kv_limit=index + t))


def test_cache_overflow_is_an_error(gqa):
    model, _ = gqa
    cache = llama.init_cache(model.config, 1, 8).replace(index=jnp.int32(6))
    # Checked on the concrete index while tracing: eval_shape runs no computation.
    jax.eval_shape(lambda: model.forward(jnp.ones((1, 2), jnp.int32), cache=cache))
    with pytest.raises(ValueError, match="6 slots used \\+ 3 new tokens > max_len 8"):
        jax.eval_shape(lambda: model.forward(jnp.ones((1, 3), jnp.int32), cache=cache))


def test_bfloat16_forward_close_to_float32(tmp_path):
    # transformers' own init scale would make attention almost uniform; 0.05 keeps it sharp
    # enough that bf16 rounding shows, without the chaos of the 0.2 used for parity.
    hf = hf_utils.save_random_hf_model(tmp_path, seed=7, initializer_range=0.05,
                                       **CASES["gqa_llama3_rope"])
    f32 = checkpoint_hf.from_pretrained(tmp_path)
    bf16 = checkpoint_hf.from_pretrained(tmp_path, dtype="bfloat16")
    assert bf16.config.dtype == bf16.config.param_dtype == "bfloat16"
    assert bf16.layers[0].self_attn.q_proj[...].dtype == jnp.bfloat16
    mixed = checkpoint_hf.from_pretrained(tmp_path, dtype="bfloat16", param_dtype="float32")
    assert mixed.layers[0].mlp.up_proj[...].dtype == jnp.float32
    ids, mask = _ids(5, (B, T)), _left_padded_mask()
    ref = hf_utils.our_logits(f32, ids, mask)[mask]
    rel_err = lambda x: np.linalg.norm(x - ref) / np.linalg.norm(ref)  # noqa: E731
    hf_bf16 = hf_utils.hf_logits(hf.to(torch.bfloat16), ids, mask)[mask]
    for model in (bf16, mixed):
        out = hf_utils.our_logits(model, ids, mask)
        assert out.dtype == np.float32  # logits are float32 whatever the compute dtype
        out = out[mask]
        assert np.isfinite(out).all()
        # Close to float32, and no further from it than transformers' own bfloat16 forward.
        assert 0 < rel_err(out) < 1e-2, rel_err(out)
        assert rel_err(out) < 1.5 * rel_err(hf_bf16), (rel_err(out), rel_err(hf_bf16))


def test_parameters_carry_logical_axis_names(gqa):
    model, _ = gqa
    fresh = nnx.eval_shape(lambda: llama.init(llama.preset("tiny")))  # metadata, no compute
    known = {"vocab", "embed", "q_heads", "kv_heads", "mlp", "norm"}
    for m in (model, fresh):
        params = list(nnx.iter_graph(m))
        variables = [v for _, v in params if isinstance(v, nnx.Param)]
        assert len(variables) == 9 * m.config.num_hidden_layers + 2 + (
            0 if m.config.tie_word_embeddings else 1)
        for v in variables:
            names = v.get_metadata()["out_sharding"]
            assert len(names) == v.get_value().ndim and set(names) <= known, names
    assert model.embed_tokens.get_metadata()["out_sharding"] == ("vocab", "embed")
    assert model.lm_head.get_metadata()["out_sharding"] == ("embed", "vocab")
    attn = model.layers[0].self_attn
    assert attn.q_proj.get_metadata()["out_sharding"] == ("embed", "q_heads")
    assert attn.o_proj.get_metadata()["out_sharding"] == ("q_heads", "embed")


def test_presets_and_config_validation():
    tiny = llama.preset("tiny")
    assert 100_000 < tiny.num_params() < 1_000_000
    assert 15e6 < llama.preset("small_20m").num_params() < 25e6
    b1 = llama.preset("llama3_2_1b")
    assert 1.1e9 < b1.num_params() < 1.3e9 and b1.tie_word_embeddings
    assert 7.9e9 < llama.preset("llama3_8b").num_params() < 8.1e9
    model = nnx.eval_shape(lambda: llama.init(tiny))
    assert sum(v.get_value().size for _, v in nnx.iter_graph(model)
               if isinstance(v, nnx.Param)) == tiny.num_params()
    with pytest.raises(ValueError, match="'nope'"):
        llama.preset("nope")
    with pytest.raises(ValueError, match="'yarn'"):
        llama.preset("tiny", rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="low_freq_factor"):
        llama.preset("tiny", rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                           "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 64})
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        llama.preset("tiny", num_key_value_heads=3)
    hash(tiny)  # static under jit


def test_query_chunked_attention_matches_transformers(gqa):
    """config.attention_chunk: attention in query blocks (T not a multiple of the block, so
    the padded tail is exercised) gives transformers' logits, with and without a KV cache,
    and the same gradients."""
    model, hf = gqa
    ids, mask = _ids(5, (B, T)), _left_padded_mask()
    want = hf_utils.hf_logits(hf, ids, mask)
    graphdef, state = nnx.split(model)
    chunked = nnx.merge(graphdef, state)
    chunked.config = model.config.replace(attention_chunk=5)
    full = model.forward(jnp.asarray(ids), jnp.asarray(mask))
    out = chunked.forward(jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(out.logits)[mask], np.asarray(full.logits)[mask],
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(out.logits)[mask], want[mask], atol=ATOL, rtol=0)
    # The chunked program really is blocked: its attention scores have 5 query rows.
    shapes = jaxpr_shapes(lambda i, m: chunked.forward(i, m).logits, jnp.asarray(ids),
                          jnp.asarray(mask))
    assert {s[-2] for s in shapes if len(s) == 5 and s[-1] == T} == {5}
    # Prefill through the cache (a longer cache than the prompt), chunked.
    cache = llama.init_cache(model.config, B, T + 4)
    pre = chunked.forward(jnp.asarray(ids), jnp.asarray(mask), cache=cache)
    np.testing.assert_allclose(np.asarray(pre.logits)[mask], np.asarray(full.logits)[mask],
                               atol=1e-5, rtol=0)

    def loss(m):
        return jnp.sum(m.forward(jnp.asarray(ids), jnp.asarray(mask)).logits[:, -1] ** 2)
    g_full, g_chunk = nnx.grad(loss)(model), nnx.grad(loss)(chunked)
    for a, b in zip(jax.tree.leaves(nnx.state(g_full)), jax.tree.leaves(nnx.state(g_chunk))):
        scale = float(np.abs(np.asarray(a)).max())
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-3 * scale, rtol=1e-3)


@pytest.mark.parametrize("change", [dict(), dict(remat=True, attention_chunk=5),
                                    dict(sliding_window=6,
                                         layer_types=("sliding_attention", "full_attention"))])
def test_scanned_layers_equal_the_unrolled_layers_and_their_gradients(change):
    """`scan_layers` (the layers as one lax.scan over stacked weights) computes the unrolled
    model's logits and parameter gradients, remat, query chunks and mixed windows included.
    Negative control: the same scan over the layers in reverse order differs."""
    cfg = llama.preset("tiny", **change)
    model = llama.init(cfg, seed=3)
    scanned = _scanned(model)
    ids, mask = jnp.asarray(_ids(7, (B, T), cfg.vocab_size)), jnp.asarray(_left_padded_mask())

    def loss(m):
        logits = m(ids, mask)
        return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits), 0.0)[..., :7])

    (l0, g0), (l1, g1) = (nnx.jit(nnx.value_and_grad(loss))(m) for m in (model, scanned))
    np.testing.assert_allclose(np.asarray(scanned(ids, mask)), np.asarray(model(ids, mask)),
                               atol=1e-5, rtol=0)
    leaves0, leaves1 = jax.tree.leaves(nnx.state(g0)), jax.tree.leaves(nnx.state(g1))
    assert len(leaves0) == len(leaves1) and float(abs(l0 - l1)) < 1e-3 * abs(float(l0))
    for a, b in zip(leaves0, leaves1):
        scale = float(jnp.abs(a).max())
        assert scale > 0  # every parameter (every layer) gets a gradient
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4 * scale, rtol=0)
    backwards = _scanned(model)
    backwards.layers = nnx.List(list(backwards.layers)[::-1])
    assert float(jnp.abs(backwards(ids, mask) - model(ids, mask)).max()) > 1e-2
