"""The sampling distribution (grammar mask, temperature, top-k, top-p) against a NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.generation import sampling
from jaxsocial.generation.sampling import SamplingConfig


def ref_probs(logits, temperature, top_k=0, top_p=1.0, allowed=None):
    """NumPy float64 reference of the sampling distribution, row by row: mask -> /T -> keep the
    k largest -> keep the shortest descending prefix whose mass reaches top_p -> renormalise."""
    x = np.asarray(logits, np.float64).copy()
    out = np.zeros_like(x)
    for r in range(x.shape[0]):
        row = x[r].copy()
        if allowed is not None:
            row[~allowed[r]] = -np.inf
        if temperature > 0:
            row = row / temperature
        if 0 < top_k < row.size:
            kth = np.sort(row)[-top_k]
            row[row < kth] = -np.inf
        if top_p < 1.0:
            p = np.exp(row - row.max())
            p /= p.sum()
            order = np.argsort(-row, kind="stable")
            n_keep = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
            row[order[n_keep:]] = -np.inf
        p = np.exp(row - row.max())
        out[r] = p / p.sum()
    return out


CONFIGS = [
    SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=1.3, top_k=7),
    SamplingConfig(temperature=0.8, top_p=0.6),
    SamplingConfig(temperature=0.9, top_k=10, top_p=0.75),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("with_grammar", [False, True])
def test_sampled_tokens_in_kept_set_and_logprobs_match_reference(config, with_grammar):
    rs = np.random.RandomState(0)
    logits = rs.randn(64, 40).astype(np.float32) * 2.0
    allowed = rs.rand(64, 40) < 0.5 if with_grammar else None
    if with_grammar:
        allowed[:, 0] = True  # every row allows something
    ref = ref_probs(logits, config.temperature, config.top_k, config.top_p, allowed)
    jallowed = None if allowed is None else jnp.asarray(allowed)
    for seed in range(4):
        tok, lp = sampling.sample(jax.random.key(seed), jnp.asarray(logits), config, jallowed)
        tok, lp = np.asarray(tok), np.asarray(lp)
        kept = ref[np.arange(64), tok] > 0
        assert kept.all(), f"token outside kept set in rows {np.flatnonzero(~kept)}"
        np.testing.assert_allclose(lp, np.log(ref[np.arange(64), tok]), atol=1e-5)
    # token_logprobs scores any token under the same distribution (PPO's function).
    tokens = rs.randint(0, 40, (64, 1))
    tlp = np.asarray(sampling.token_logprobs(
        jnp.asarray(logits)[:, None], jnp.asarray(tokens), config,
        None if allowed is None else jnp.asarray(allowed)[:, None]))[:, 0]
    p = ref[np.arange(64), tokens[:, 0]]
    np.testing.assert_allclose(tlp[p > 0], np.log(p[p > 0]), atol=1e-5)
    assert (tlp[p == 0] < -1e20).all()


def test_greedy_is_argmax_and_reports_temperature_one_logprob():
    rs = np.random.RandomState(1)
    logits = rs.randn(16, 30).astype(np.float32)
    config = SamplingConfig(temperature=0.0, top_k=5)
    tok, lp = sampling.sample(jax.random.key(0), jnp.asarray(logits), config)
    np.testing.assert_array_equal(np.asarray(tok), logits.argmax(-1))
    ref = ref_probs(logits, 1.0, top_k=5)
    np.testing.assert_allclose(np.asarray(lp), np.log(ref[np.arange(16), logits.argmax(-1)]),
                               atol=1e-5)


@pytest.mark.parametrize("config", [SamplingConfig(temperature=0.8, top_k=4, top_p=0.9),
                                    SamplingConfig(temperature=1.2, top_p=0.8),
                                    SamplingConfig(temperature=0.7)])  # inverse-CDF draw
def test_empirical_frequencies_match_renormalised_probabilities(config):
    logits = np.array([2.0, 1.5, 1.0, 0.4, 0.0, -1.0, -2.0], np.float32)
    n = 200_000
    p = ref_probs(logits[None], config.temperature, config.top_k, config.top_p)[0]
    tok, _ = sampling.sample(jax.random.key(1234), jnp.broadcast_to(jnp.asarray(logits), (n, 7)),
                             config)
    freq = np.bincount(np.asarray(tok), minlength=7) / n
    # 5 standard errors per token: a correct sampler fails with probability < 1e-5.
    tol = 5 * np.sqrt(np.maximum(p * (1 - p), 1e-12) / n)
    assert (freq[p == 0] == 0).all(), f"excluded tokens sampled: {freq}"
    np.testing.assert_array_less(np.abs(freq - p), tol + 1e-12)
    # The tolerance has power: plausible bugs sit far outside it.
    untruncated = ref_probs(logits[None], config.temperature)[0]
    wrong = [ref_probs(logits[None], 1.0, config.top_k, config.top_p)[0],  # no temperature
             untruncated,                                                  # no truncation
             np.where(p > 0, untruncated, 0)]                              # no renormalising
    for q in wrong:
        if config.top_k or config.top_p < 1.0 or q is wrong[0]:  # no truncation to miss
            assert np.abs(q - p).max() > 4 * tol.max()


def test_same_key_same_tokens_different_key_different_tokens():
    logits = jnp.asarray(np.random.RandomState(2).randn(128, 50), jnp.float32)
    config = SamplingConfig(temperature=1.0, top_k=20)
    a, _ = sampling.sample(jax.random.key(7), logits, config)
    b, _ = sampling.sample(jax.random.key(7), logits, config)
    c, _ = sampling.sample(jax.random.key(8), logits, config)
    np.testing.assert_array_equal(a, b)
    assert (np.asarray(a) != np.asarray(c)).any()


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=-1.0), "temperature"),
    (dict(top_k=-2), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(prompt_bucket=-1), "prompt_bucket"), (dict(prefill_chunk=-1), "prefill_chunk")])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_config_is_hashable_and_normalises_stop_ids():
    a = SamplingConfig(stop_token_ids=[2, 5])
    b = SamplingConfig(stop_token_ids=(2, 5))
    assert a == b and hash(a) == hash(b) and a.stop_token_ids == (2, 5)
    assert SamplingConfig(stop_token_ids=3).stop_token_ids == (3,)
