"""generate(): parity with transformers' generate, exact log-probs, stops, grammar, no retrace."""

import dataclasses

import hf_utils
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from test_grammar import ref_accepts
from test_sampling import ref_probs

from jaxsocial.generation import (
    GenerationOutput,
    SamplingConfig,
    compile_grammar,
    free_text,
    generate,
    generate_from_state,
    recompute_logprobs,
)
from jaxsocial.generation import grammar as gr
from jaxsocial.generation.generate import PROGRAMS, bucket_length
from jaxsocial.generation.sampling import MAX_PREFILL_CHUNKS
from jaxsocial.models import checkpoint_hf, llama

V = 97
PAD, END = 0, 2

# Jitted once per shape (eager op-by-op execution would compile every primitive separately).
recompute = nnx.jit(recompute_logprobs, static_argnums=(5,))
accepts = jax.jit(gr.accepts)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(ours, torch) with the same weights: a tiny GQA Llama with llama3 RoPE scaling."""
    d = tmp_path_factory.mktemp("tiny_hf")
    torch_model = hf_utils.save_random_hf_model(
        d, seed=3, num_key_value_heads=2, head_dim=16, hidden_size=48, num_attention_heads=6,
        rope_scaling=hf_utils.LLAMA3_ROPE_SCALING)
    return checkpoint_hf.from_pretrained(d), torch_model


def left_padded(lengths, total, seed):
    rs = np.random.RandomState(seed)
    ids = rs.randint(3, V, (len(lengths), total)).astype(np.int32)
    mask = np.arange(total)[None, :] >= total - np.asarray(lengths)[:, None]
    return np.where(mask, ids, PAD).astype(np.int32), mask


def hf_generate(torch_model, ids, mask, max_new, eos):
    with torch.no_grad():
        out = torch_model.generate(
            input_ids=torch.as_tensor(ids, dtype=torch.long),
            attention_mask=torch.as_tensor(mask.astype(np.int64)), do_sample=False,
            max_new_tokens=max_new, eos_token_id=list(eos), pad_token_id=PAD)
    return out[:, ids.shape[1]:].numpy()


def check_stop_invariants(out: GenerationOutput, stops, n):
    tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
    lengths, lp = np.asarray(out.lengths), np.asarray(out.logprobs)
    assert tokens.shape == mask.shape == lp.shape == (len(lengths), n)
    assert tokens.dtype == np.int32 and lp.dtype == np.float32 and mask.dtype == bool
    np.testing.assert_array_equal(mask, np.arange(n)[None] < lengths[:, None])
    assert (tokens[~mask] == PAD).all() and (lp[~mask] == 0).all()
    assert (lp[mask] <= 0).all() and np.isfinite(lp[mask]).all()
    for row, length in zip(tokens, lengths):
        is_stop = np.isin(row[:length], stops)
        assert not is_stop[:-1].any(), f"row continued after a stop: {row}"
        assert length == n or is_stop[-1], f"row ended early without a stop: {row}"


def full_forward_reference(torch_model, ids, mask, out):
    """transformers logits [B, N, V] predicting each response token (one full forward)."""
    full_ids = np.concatenate([ids, np.asarray(out.tokens)], 1)
    full_mask = np.concatenate([mask, np.asarray(out.mask)], 1)
    logits = hf_utils.hf_logits(torch_model, full_ids, full_mask)
    p = ids.shape[1]
    return logits[:, p - 1:p - 1 + out.tokens.shape[1]]


# The whole prompt in one forward; 4 chunks of a 16 bucket; and a decode in 3 segments.
@pytest.mark.parametrize("prefill_chunk, decode_buckets", [(0, 1), (4, 1), (4, 3)])
def test_greedy_matches_transformers_generate(models, prefill_chunk, decode_buckets):
    ours, torch_model = models
    ids, mask = left_padded([5, 11, 8], 11, seed=0)
    n = 12
    # Pick a second stop id that row 0 emits mid-response, so stops are exercised per row.
    free = hf_generate(torch_model, ids, mask, n, eos=(END,))
    row = list(free[0])
    stop = next(t for i, t in enumerate(row) if i >= 2 and t not in row[:i] and t != END)
    ref = hf_generate(torch_model, ids, mask, n, eos=(END, stop))
    config = SamplingConfig(max_new_tokens=n, temperature=0.0, stop_token_ids=(END, stop),
                            prompt_bucket=16, prefill_chunk=prefill_chunk,
                            decode_buckets=decode_buckets)
    assert len(config.prefill_chunks(16)) == (4 if prefill_chunk else 1)
    out = generate(ours, ids, mask, jax.random.key(0), config)
    m = ref.shape[1]
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :m], ref)
    assert not np.asarray(out.mask)[:, m:].any()
    assert int(out.lengths[0]) == row.index(stop) + 1 < n
    check_stop_invariants(out, (END, stop), n)


SAMPLED = SamplingConfig(max_new_tokens=10, temperature=0.7, prompt_bucket=16,
                         stop_token_ids=tuple(range(2, 97, 9)))


@pytest.fixture(scope="module")
def sampled(models):
    ours, _ = models
    ids, mask = left_padded([3, 14, 9, 6, 12, 1], 14, seed=1)
    out = generate(ours, ids, mask, jax.random.key(42), SAMPLED, return_hidden=True)
    return ids, mask, out


def test_logprobs_equal_log_softmax_over_temperature_of_full_forward(models, sampled):
    ours, torch_model = models
    ids, mask, out = sampled
    logits = full_forward_reference(torch_model, ids, mask, out)
    z = logits / SAMPLED.temperature
    ref = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(
        -1, keepdims=True)
    tokens, m = np.asarray(out.tokens), np.asarray(out.mask)
    ref_lp = np.take_along_axis(ref, tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], ref_lp[m], atol=1e-4)
    again = recompute(ours, jnp.asarray(ids), jnp.asarray(mask), out.tokens, out.mask,
                               SAMPLED)
    np.testing.assert_allclose(np.asarray(again), np.asarray(out.logprobs), atol=1e-4)


def test_chunked_prefill_gives_the_whole_prompts_logprobs(models, sampled):
    """Prefill in 4 chunks (each attending only to the slots filled so far) against one
    forward over the whole prompt: the same tokens and log-probs to float rounding, and both
    equal a re-scoring. The rows' prompts (1..14 real tokens) start inside different chunks,
    so some rows' first chunks are all padding."""
    ours, _ = models
    ids, mask, _ = sampled
    outs = [generate(ours, ids, mask, jax.random.key(5),
                     dataclasses.replace(SAMPLED, prefill_chunk=c)) for c in (0, 4)]
    whole, chunked = outs
    assert not np.asarray(whole.mask).all() and np.asarray(whole.lengths).max() > 1
    np.testing.assert_array_equal(np.asarray(chunked.tokens), np.asarray(whole.tokens))
    np.testing.assert_allclose(np.asarray(chunked.logprobs), np.asarray(whole.logprobs),
                               atol=1e-5, rtol=0)
    again = recompute(ours, jnp.asarray(ids), jnp.asarray(mask), chunked.tokens, chunked.mask,
                      SAMPLED)
    np.testing.assert_allclose(np.asarray(again), np.asarray(chunked.logprobs), atol=1e-4)


def test_prefill_chunks_plan():
    plan = SamplingConfig(prefill_chunk=64).prefill_chunks
    assert plan(128) == ((0, 64), (64, 128))
    assert plan(100) == ((0, 64), (64, 100))
    assert plan(64) == ((0, 64),) and plan(40) == ((0, 40),)
    assert SamplingConfig(prefill_chunk=0).prefill_chunks(4096) == ((0, 4096),)
    # At most MAX_PREFILL_CHUNKS forwards: a long prompt gets longer chunks.
    long = plan(4096)
    assert len(long) == MAX_PREFILL_CHUNKS and long[-1] == (3584, 4096)
    assert all(a[1] == b[0] for a, b in zip(long, long[1:]))


def test_decode_buckets_grow_the_cache_and_keep_the_tokens(models, sampled, monkeypatch):
    """decode_buckets=3 runs SAMPLED's 10 steps over caches of P + 4, P + 7 and P + 10 slots
    (the prefill allocates the first only) and gives the tokens and log-probs of one loop over
    P + 10 slots, for rows that stop at different steps; a re-scoring agrees. Negative
    control: a grow that forgets which slots are filled changes the tokens."""
    ours, _ = models
    ids, mask, _ = sampled
    bucketed = dataclasses.replace(SAMPLED, decode_buckets=3)
    assert bucketed.decode_segments() == (4, 7, 10)
    graphdef, state = nnx.split(ours)
    prefill, _ = PROGRAMS.get(graphdef, 16, ids.shape[0], bucketed, False, False)
    cache, _ = jax.eval_shape(prefill, state, jnp.pad(ids, ((0, 0), (2, 0))),
                              jnp.pad(mask, ((0, 0), (2, 0))))
    assert cache.mask.shape == (ids.shape[0], 16 + 4)
    one, three = [generate(ours, ids, mask, jax.random.key(6), c) for c in (SAMPLED, bucketed)]
    lengths = np.asarray(one.lengths)
    assert lengths.min() < 4 and lengths.max() > 7  # rows stop in different segments
    np.testing.assert_array_equal(np.asarray(three.tokens), np.asarray(one.tokens))
    np.testing.assert_allclose(np.asarray(three.logprobs), np.asarray(one.logprobs), atol=1e-5,
                               rtol=0)
    again = recompute(ours, jnp.asarray(ids), jnp.asarray(mask), three.tokens, three.mask,
                      SAMPLED)
    np.testing.assert_allclose(np.asarray(again), np.asarray(three.logprobs), atol=1e-4)

    grow = llama.KVCache.grow
    monkeypatch.setattr(llama.KVCache, "grow",
                        lambda c, n: grow(c.replace(mask=jnp.zeros_like(c.mask)), n))
    compiled = dict(PROGRAMS.compiled)
    PROGRAMS.clear()  # retrace with the broken grow, then put the good programs back
    try:
        broken = generate(ours, ids, mask, jax.random.key(6), bucketed)
        assert not np.array_equal(np.asarray(broken.tokens), np.asarray(one.tokens))
    finally:
        PROGRAMS.clear()
        PROGRAMS.compiled.update(compiled)


@pytest.mark.parametrize("stacked", [False, True])
def test_kv_cache_grow_keeps_the_filled_slots(stacked):
    config = llama.preset("tiny", scan_layers=stacked)
    cache = llama.init_cache(config, 2, 5)
    k = jax.tree.map(lambda x: jax.random.normal(jax.random.key(x.ndim), x.shape), cache.k)
    cache = cache.replace(k=k, mask=cache.mask.at[:, 2:].set(True), index=jnp.int32(5),
                          lengths=jnp.array([3, 3], jnp.int32))
    grown = cache.grow(8)
    assert type(grown.k) is type(cache.k) and grown.mask.shape == (2, 8)
    axis = 2 if stacked else 1
    for old, new in zip(jax.tree.leaves(cache.k), jax.tree.leaves(grown.k)):
        assert new.shape[axis] == 8
        np.testing.assert_array_equal(np.asarray(jnp.take(new, jnp.arange(5), axis)), old)
        assert not np.asarray(jnp.take(new, jnp.arange(5, 8), axis)).any()
    np.testing.assert_array_equal(np.asarray(grown.mask[:, :5]), np.asarray(cache.mask))
    assert not np.asarray(grown.mask[:, 5:]).any()
    assert int(grown.index) == 5 and list(np.asarray(grown.lengths)) == [3, 3]
    with pytest.raises(ValueError, match="cannot grow a cache of 5 slots to 4"):
        cache.grow(4)


@pytest.mark.parametrize("field, value, match", [
    ("decode_buckets", 0, "decode_buckets must be in \\[1, max_new_tokens=8\\], got 0"),
    ("decode_buckets", 9, "decode_buckets must be in \\[1, max_new_tokens=8\\], got 9"),
    ("prefill_chunk", -1, "prefill_chunk must be >= 0, got -1"),
    ("prompt_group", -2, "prompt_group must be >= 0, got -2")])
def test_bad_sampling_config_raises(field, value, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(max_new_tokens=8, **{field: value})
    SamplingConfig(max_new_tokens=8, **{field: 8 if field == "decode_buckets" else 0})


def test_hidden_is_final_hidden_state_of_last_response_token(models, sampled):
    ours, _ = models
    ids, mask, out = sampled
    full = nnx.jit(lambda m, i, k: m.forward(i, k))(
        ours, jnp.concatenate([jnp.asarray(ids), out.tokens], 1),
        jnp.concatenate([jnp.asarray(mask), out.mask], 1))
    last = ids.shape[1] + np.asarray(out.lengths) - 1
    ref = np.asarray(full.hidden)[np.arange(len(last)), last]
    assert out.hidden.shape == (len(last), ours.config.hidden_size)
    np.testing.assert_allclose(np.asarray(out.hidden), ref, atol=1e-4)


def test_rows_stop_independently_and_nothing_unmasked_after_stop(sampled):
    _, _, out = sampled
    check_stop_invariants(out, SAMPLED.stop_token_ids, SAMPLED.max_new_tokens)
    lengths = np.asarray(out.lengths)
    assert lengths.min() < SAMPLED.max_new_tokens and len(set(lengths.tolist())) >= 3, lengths


def test_same_key_same_tokens(models, sampled):
    ours, _ = models
    ids, mask, out = sampled
    again = generate(ours, ids, mask, jax.random.key(42), SAMPLED, return_hidden=True)
    other = generate(ours, ids, mask, jax.random.key(43), SAMPLED, return_hidden=True)
    np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(out.tokens))
    np.testing.assert_array_equal(np.asarray(again.logprobs), np.asarray(out.logprobs))
    assert (np.asarray(other.tokens) != np.asarray(out.tokens)).any()


# Actions over the tiny vocabulary: "like <1-2 digits>", "post: <1-6 free tokens>", "noop".
DIGITS = tuple(range(20, 30))
FORBIDDEN = tuple(range(60, 97))  # never allowed anywhere
PATTERNS = [[[10], gr.Repeat(DIGITS, 1, 2)],
            [[11, 12], free_text(6, exclude=(PAD, 1, END) + FORBIDDEN)],
            [[13, 14, 15]]]
GRAMMAR_CFG = SamplingConfig(max_new_tokens=12, temperature=1.3, top_k=12, top_p=0.95,
                             stop_token_ids=(END,), prompt_bucket=16)


def test_grammar_outputs_accepted_and_logprobs_exact(models):
    ours, torch_model = models
    grammar = compile_grammar(PATTERNS, V, end_token_ids=(END,))
    ids, mask = left_padded([4, 9, 16, 2, 7, 11, 13, 5], 16, seed=2)
    out = generate(ours, ids, mask, jax.random.key(7), GRAMMAR_CFG, grammar=grammar)
    tokens, m, lp = np.asarray(out.tokens), np.asarray(out.mask), np.asarray(out.logprobs)
    check_stop_invariants(out, (END,), GRAMMAR_CFG.max_new_tokens)
    # Accepted by the FSM and by the independent backtracking matcher; forbidden ids never occur.
    assert np.asarray(accepts(grammar, out.tokens, out.mask)).all()
    for row, length in zip(tokens, np.asarray(out.lengths)):
        assert ref_accepts(PATTERNS, list(row[:length]), V, (END,)), row
    assert not np.isin(tokens[m], FORBIDDEN).any()
    kinds = {int(row[0]) for row in tokens}
    assert len(kinds) >= 2, f"every row chose the same action: {tokens}"
    # Log-probs: NumPy reference distribution over the transformers logits, with the mask of
    # the FSM state before each token (replayed here from the arrays, step by step).
    logits = full_forward_reference(torch_model, ids, mask, out)
    allowed_tab, next_tab = np.asarray(grammar.allowed), np.asarray(grammar.next_state)
    for b in range(len(tokens)):
        state = int(grammar.start)
        for t in range(int(out.lengths[b])):
            p = ref_probs(logits[b, t][None], GRAMMAR_CFG.temperature, GRAMMAR_CFG.top_k,
                          GRAMMAR_CFG.top_p, allowed_tab[state][None])[0]
            assert p[tokens[b, t]] > 0
            np.testing.assert_allclose(lp[b, t], np.log(p[tokens[b, t]]), atol=1e-4)
            state = next_tab[state, tokens[b, t]]
    again = recompute(ours, jnp.asarray(ids), jnp.asarray(mask), out.tokens, out.mask,
                               GRAMMAR_CFG, grammar=grammar)
    np.testing.assert_allclose(np.asarray(again), np.asarray(out.logprobs), atol=1e-4)


def test_no_recompilation_within_a_bucket(models, sampled):
    ours, _ = models
    ids0, _, _ = sampled  # the fixture compiled (bucket 16, batch 6, SAMPLED, hidden)
    before = dict(PROGRAMS.trace_counts)
    ids, mask = left_padded([9, 13, 2, 5, 11, 7], 13, seed=4)  # another batch, same bucket
    assert ids.shape[1] != ids0.shape[1] and bucket_length(13, 16) == 16
    out = generate(ours, ids, mask, jax.random.key(1), SAMPLED, return_hidden=True)
    jax.block_until_ready(out.tokens)
    assert dict(PROGRAMS.trace_counts) == before
    ids, mask = left_padded([20, 3, 5, 7, 9, 11], 20, seed=5)  # next bucket (32): new programs
    generate(ours, ids, mask, jax.random.key(2), SAMPLED, return_hidden=True)
    assert PROGRAMS.trace_counts["prefill"] == before["prefill"] + 1
    assert PROGRAMS.trace_counts["decode"] == before["decode"] + 1


def test_kv_cache_allocated_once_at_bucket_plus_new_in_compute_dtype(models, tmp_path):
    ours, _ = models
    checkpoint_hf.save_pretrained(ours, tmp_path)
    bf16 = checkpoint_hf.from_pretrained(tmp_path, dtype="bfloat16")
    config = SamplingConfig(max_new_tokens=7, prompt_bucket=16)
    graphdef, state = nnx.split(bf16)
    prefill, _ = PROGRAMS.get(graphdef, 16, 3, config, False, False)
    ids, mask = left_padded([5, 9, 16], 16, seed=6)
    cache, logits = jax.eval_shape(prefill, state, ids, mask)
    c = bf16.config
    assert len(cache.k) == len(cache.v) == c.num_hidden_layers
    assert all(x.shape == (3, 16 + 7, c.num_key_value_heads, c.head_dim) for x in cache.k + cache.v)
    assert all(x.dtype == jnp.bfloat16 for x in cache.k + cache.v)
    assert logits.shape == (3, V) and logits.dtype == jnp.float32


def test_prompt_group_prefills_each_shared_prompt_once(models):
    """3 prompts x 4 samples with prompt_group=4: the prefill program runs on 3 rows (a quarter
    of the ungrouped program's FLOPs), greedy tokens equal the ungrouped call's, sampled rows
    of a group differ from each other, and re-scoring reproduces their log-probs."""
    ours, _ = models
    base, base_mask = left_padded([5, 11, 8], 11, seed=2)
    ids, mask = np.repeat(base, 4, axis=0), np.repeat(base_mask, 4, axis=0)
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0, prompt_bucket=16)
    grouped = dataclasses.replace(greedy, prompt_group=4)
    flops = []
    graphdef, state = nnx.split(ours)
    for config in (greedy, grouped):
        prefill, _ = PROGRAMS.get(graphdef, 16, 12, config, False, False)
        pids = np.pad(ids, ((0, 0), (5, 0)))
        pmask = np.pad(mask, ((0, 0), (5, 0)))
        cache, _ = jax.eval_shape(prefill, state, pids, pmask)
        assert cache.k[0].shape[0] == 12  # the cache has every row either way
        flops.append(prefill.lower(state, pids, pmask).compile().cost_analysis()["flops"])
    assert 3.5 < flops[0] / flops[1] < 4.5, flops
    outs = [generate(ours, ids, mask, jax.random.key(3), c) for c in (greedy, grouped)]
    np.testing.assert_array_equal(np.asarray(outs[1].tokens), np.asarray(outs[0].tokens))
    np.testing.assert_allclose(np.asarray(outs[1].logprobs), np.asarray(outs[0].logprobs),
                               atol=1e-5)
    sampled = dataclasses.replace(SAMPLED, prompt_group=4)
    out = generate(ours, ids, mask, jax.random.key(4), sampled)
    tokens = np.asarray(out.tokens).reshape(3, 4, -1)
    assert all(len({row.tobytes() for row in group}) > 1 for group in tokens)
    again = recompute(ours, jnp.asarray(ids), jnp.asarray(mask), out.tokens, out.mask, sampled)
    np.testing.assert_allclose(np.asarray(again), np.asarray(out.logprobs), atol=1e-4)


def test_bucket_length():
    assert [bucket_length(n, 64) for n in (1, 64, 65, 128)] == [64, 64, 128, 128]
    assert [bucket_length(n, 0) for n in (1, 3, 4, 5, 100)] == [1, 4, 4, 8, 128]


@pytest.mark.parametrize("case, match", [
    ("right_padded", "not left-padded"), ("empty_row", "has no tokens"),
    ("shape", "attention_mask shape"), ("stop", "stop token id 500"),
    ("grammar_vocab", "grammar vocab size"), ("token", "outside the vocabulary"),
    ("group_size", "prompt_group 3 does not divide the batch of 2 rows"),
    ("group_prompts", "the rows of group 0 \\(rows 0-1\\) do not share one prompt")])
def test_bad_inputs_raise(models, case, match):
    ours, _ = models
    ids, mask = left_padded([3, 4], 4, seed=0)
    config, grammar = SamplingConfig(max_new_tokens=2), None
    if case.startswith("group"):
        config = SamplingConfig(max_new_tokens=2, prompt_group=3 if case == "group_size" else 2)
    if case == "right_padded":
        mask = mask[:, ::-1].copy()
    elif case == "empty_row":
        mask[0] = False
    elif case == "shape":
        mask = mask[:, 1:]
    elif case == "stop":
        config = SamplingConfig(max_new_tokens=2, stop_token_ids=(500,))
    elif case == "grammar_vocab":
        grammar = compile_grammar([[[1]]], V + 1)
    elif case == "token":
        ids[1, -1] = V
    with pytest.raises(ValueError, match=match):
        generate(ours, ids, mask, jax.random.key(0), config, grammar=grammar)


def test_generate_from_state_inside_an_outer_jit(models, sampled):
    """The training loop calls generate_from_state inside its own jit: same tokens as eager."""
    ours, _ = models
    ids, mask, out = sampled
    graphdef, state = nnx.split(ours)

    @jax.jit
    def rollout(state, ids, mask, key):
        return generate_from_state(graphdef, state, ids, mask, key, SAMPLED, return_hidden=True)

    nested = rollout(state, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(42))
    np.testing.assert_array_equal(np.asarray(nested.tokens), np.asarray(out.tokens))
    np.testing.assert_allclose(np.asarray(nested.logprobs), np.asarray(out.logprobs), atol=1e-5)
