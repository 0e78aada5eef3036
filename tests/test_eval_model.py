"""The registered lm-eval model on the tiny Llama: generate_until through our engine with stop
strings applied, loglikelihoods equal to a direct float64 computation from our model's logits,
rolling loglikelihoods, chat template, and both entry points (simple_evaluate / arg string)."""

import json
import os

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from jaxsocial.eval import lm_eval_model  # noqa: E402
from jaxsocial.generation import SamplingConfig, generate  # noqa: E402
from jaxsocial.models import llama  # noqa: E402
from jaxsocial.models.tokenizer import tiny_tokenizer  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "eval")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_ckpt"))
    model = llama.init(llama.preset("tiny"), seed=3)
    llama.save_pretrained(model, path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lm(checkpoint):
    return lm_eval_model.JaxSocialLM(checkpoint=checkpoint, batch_size=4)


def _req(kind, args, i=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


def _direct_loglik(lm, ctx, cont):
    """Unpadded, unbatched reference: sum_j log_softmax(logits[len(ctx)-1+j])[cont_j] (float64)."""
    ctx_ids = lm.tok_encode(ctx)
    whole = lm.tok_encode(ctx + cont)
    cont_ids = whole[len(ctx_ids):]
    logits = np.asarray(lm.model.forward(jnp.asarray([whole], jnp.int32)).logits[0], np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                             keepdims=True)) \
        - logits.max(-1, keepdims=True)
    pos = np.arange(len(ctx_ids) - 1, len(whole) - 1)
    greedy = bool((logits[pos].argmax(-1) == np.asarray(cont_ids)).all())
    return float(logp[pos, cont_ids].sum()), greedy


def test_registered():
    assert get_model("jaxsocial") is lm_eval_model.JaxSocialLM


def test_loglikelihood_matches_direct_computation(lm):
    pairs = [("The sky is", " blue"), ("Two plus two is", " four and a bit more text"),
             ("Q: Say hello.\nA:", " hello"), ("x", "y")]
    got = lm.loglikelihood([_req("loglikelihood", p, i) for i, p in enumerate(pairs)])
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        ref_ll, ref_greedy = _direct_loglik(lm, ctx, cont)
        assert ll == pytest.approx(ref_ll, abs=2e-4)
        assert greedy == ref_greedy


def test_loglikelihood_rolling_matches_direct_computation(lm):
    text = "The quick brown fox jumps over the lazy dog."
    (got,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", (text,))])
    ids = [lm.prefix_token_id] + lm.tok_encode(text, add_special_tokens=False)
    logits = np.asarray(lm.model.forward(jnp.asarray([ids], jnp.int32)).logits[0], np.float64)
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    ref = logp[np.arange(len(ids) - 1), ids[1:]].sum()
    assert got == pytest.approx(ref, abs=2e-4)


def test_generate_until_uses_engine_and_applies_stops(lm, checkpoint):
    prompt = "Q: What is 2 + 2?\nA:"
    (raw,) = lm.generate_until([_req("generate_until", (prompt, {"until": [],
                                                                 "max_gen_toks": 12}))])
    # The same greedy tokens straight from the engine.
    ids = lm.tok_encode(prompt)
    out = generate(lm.model, jnp.asarray([ids], jnp.int32), jnp.ones((1, len(ids)), bool),
                   jax.random.key(0), SamplingConfig(max_new_tokens=12, temperature=0.0,
                                                     stop_token_ids=lm.stop_token_ids))
    toks = [int(t) for t in np.asarray(out.tokens[0, :int(out.lengths[0])])
            if int(t) not in lm.stop_token_ids]
    assert raw == lm.tokenizer.decode(toks, skip_special_tokens=True)
    assert len(raw) >= 4
    stop = raw[2:4]
    (cut,) = lm.generate_until([_req("generate_until", (prompt, {"until": [stop, "\x00never"],
                                                                 "max_gen_toks": 12}))])
    assert cut == raw[:raw.index(stop)] and stop not in cut


def test_truncate_at_stops():
    assert lm_eval_model.truncate_at_stops("abc\ndef\nclass X", ["\nclass", "\n"]) == "abc"
    assert lm_eval_model.truncate_at_stops("abc", ["", "zz"]) == "abc"


def test_chat_template(lm):
    text = lm.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text.startswith("<|begin_of_text|>") and text.rstrip().endswith("<|end_header_id|>")
    assert "hi" in text and lm.tokenizer_name


def test_bad_args(checkpoint):
    with pytest.raises(ValueError, match="not_a_dir"):
        lm_eval_model.JaxSocialLM(checkpoint="/not_a_dir")
    with pytest.raises(ValueError, match="bogus"):
        lm_eval_model.JaxSocialLM(checkpoint=checkpoint, bogus=1)


def _materialize(tmp_path, stop):
    for name in ("tiny_gen.yaml", "tiny_mc.yaml", "tiny_ppl.yaml"):
        with open(os.path.join(FIXTURES, name)) as f:
            text = f.read().replace("@HERE@", FIXTURES).replace("@STOP@", json.dumps(stop))
        (tmp_path / name).write_text(text)
    return TaskManager(include_path=str(tmp_path), include_defaults=False)


def test_simple_evaluate_generate_mc_and_rolling(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    prompt = "Q: What is 2 + 2?\nA:"
    (raw,) = lm.generate_until([_req("generate_until", (prompt, {"until": [],
                                                                 "max_gen_toks": 12}))])
    stop = raw[2:4]
    tm = _materialize(tmp_path, stop)
    res = lm_eval.simple_evaluate(model=lm, tasks=["jaxsocial_test_gen", "jaxsocial_test_mc",
                                                   "jaxsocial_test_ppl"],
                                  task_manager=tm, log_samples=True, bootstrap_iters=0)
    gen = res["samples"]["jaxsocial_test_gen"]
    assert len(gen) == 5
    first = next(s for s in gen if s["doc"]["question"] == prompt)
    assert first["resps"][0][0] == raw[:raw.index(stop)]
    for s in gen:
        assert stop not in s["resps"][0][0]
    assert 0.0 <= res["results"]["jaxsocial_test_gen"]["exact_match,none"] <= 1.0

    mc = res["samples"]["jaxsocial_test_mc"]
    assert len(mc) == 4
    correct = []
    for s in mc:
        lls = [r[0][0] for r in s["resps"]]
        for arg, ll in zip(s["arguments"], lls):
            ctx, cont = arg[0], arg[1]
            assert ll == pytest.approx(_direct_loglik(lm, ctx, cont)[0], abs=2e-4)
        correct.append(float(np.argmax(lls) == s["doc"]["label"]))
    assert res["results"]["jaxsocial_test_mc"]["acc,none"] == pytest.approx(np.mean(correct))
    assert np.isfinite(res["results"]["jaxsocial_test_ppl"]["word_perplexity,none"])


def test_cli_arg_string(checkpoint):
    lm = get_model("jaxsocial").create_from_arg_string(
        f"checkpoint={checkpoint},max_gen_toks=8,seed=1", {"batch_size": 2, "device": "cpu"})
    assert lm.batch_size == 2 and lm.max_gen_toks == 8
