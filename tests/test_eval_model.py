"""The registered lm-eval model on the tiny Llama: generate_until through our engine with stop
strings applied, loglikelihoods equal to a direct float64 computation from our model's logits,
rolling loglikelihoods, chat template, and both entry points (simple_evaluate / arg string)."""

import json
import os

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")

import jax
import jax.numpy as jnp
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from jaxsocial.eval import lm_eval_model
from jaxsocial.generation import SamplingConfig, generate
from jaxsocial.models import checkpoint_hf, llama
from jaxsocial.models.tokenizer import tiny_tokenizer

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "eval")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_ckpt"))
    model = llama.init(llama.preset("tiny"), seed=3)
    checkpoint_hf.save_pretrained(model, path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lm(checkpoint):
    return lm_eval_model.JaxSocialLM(checkpoint=checkpoint, batch_size=4)


def _req(kind, args, i=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


REF_LEN = 64


@pytest.fixture(scope="module")
def ref_logits(lm):
    """Unbatched reference logits [T, V] float64 for one sequence, right-padded to REF_LEN (a
    causal model's logits at real positions ignore later padding; one compiled shape)."""
    fwd = jax.jit(lambda ids: lm.model.forward(ids).logits)

    def run(ids):
        assert len(ids) <= REF_LEN
        padded = np.zeros((1, REF_LEN), np.int32)
        padded[0, :len(ids)] = ids
        return np.asarray(fwd(jnp.asarray(padded))[0, :len(ids)], np.float64)

    return run


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _direct_loglik(lm, ref_logits, ctx, cont):
    """sum_j log_softmax(logits[len(ctx)-1+j])[cont_j] in float64, no padding or batching."""
    ctx_ids = lm.tok_encode(ctx)
    whole = lm.tok_encode(ctx + cont)
    cont_ids = whole[len(ctx_ids):]
    logits = ref_logits(whole)
    pos = np.arange(len(ctx_ids) - 1, len(whole) - 1)
    greedy = bool((logits[pos].argmax(-1) == np.asarray(cont_ids)).all())
    return float(_log_softmax(logits)[pos, cont_ids].sum()), greedy


@pytest.fixture(scope="module")
def raw_greedy(lm):
    """The model's greedy 12-token answer to PROMPT with no stop strings."""
    (raw,) = lm.generate_until([_req("generate_until", (PROMPT, {"until": [],
                                                                 "max_gen_toks": 12}))])
    assert len(raw) >= 4
    return raw


PROMPT = "Q: What is 2 + 2?\nA:"


def test_registered():
    assert get_model("jaxsocial") is lm_eval_model.JaxSocialLM
    from jaxsocial.eval.__main__ import register_models
    register_models()  # what `python -m jaxsocial.eval` does: lm-eval's own models stay usable
    from lm_eval.models.huggingface import HFLM
    assert get_model("hf") is HFLM and get_model("jaxsocial") is lm_eval_model.JaxSocialLM


def test_loglikelihood_matches_direct_computation(lm, ref_logits):
    pairs = [("The sky is", " blue"), ("Two plus two is", " four and a bit more text"),
             ("Q: Say hello.\nA:", " hello"), ("x", "y")]
    got = lm.loglikelihood([_req("loglikelihood", p, i) for i, p in enumerate(pairs)])
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        ref_ll, ref_greedy = _direct_loglik(lm, ref_logits, ctx, cont)
        assert ll == pytest.approx(ref_ll, abs=2e-4)
        assert greedy == ref_greedy


def test_loglikelihood_rolling_matches_direct_computation(lm, ref_logits):
    text = "The quick brown fox jumps over the lazy dog."
    (got,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", (text,))])
    ids = [lm.prefix_token_id] + lm.tok_encode(text, add_special_tokens=False)
    ref = _log_softmax(ref_logits(ids))[np.arange(len(ids) - 1), ids[1:]].sum()
    assert got == pytest.approx(ref, abs=2e-4)


def test_generate_until_uses_engine_and_applies_stops(lm, raw_greedy):
    # The same greedy tokens straight from the engine.
    ids = lm.tok_encode(PROMPT)
    out = generate(lm.model, jnp.asarray([ids], jnp.int32), jnp.ones((1, len(ids)), bool),
                   jax.random.key(0), SamplingConfig(max_new_tokens=12, temperature=0.0,
                                                     stop_token_ids=lm.stop_token_ids))
    toks = [int(t) for t in np.asarray(out.tokens[0, :int(out.lengths[0])])
            if int(t) not in lm.stop_token_ids]
    assert raw_greedy == lm.tokenizer.decode(toks, skip_special_tokens=True)
    stop = raw_greedy[2:4]
    (cut,) = lm.generate_until([_req("generate_until", (PROMPT, {"until": [stop, "\x00never"],
                                                                 "max_gen_toks": 12}))])
    assert cut == raw_greedy[:raw_greedy.index(stop)] and stop not in cut


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


def test_simple_evaluate_generate_mc_and_rolling(lm, ref_logits, raw_greedy, tmp_path,
                                               monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    prompt, raw = PROMPT, raw_greedy
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
            assert ll == pytest.approx(_direct_loglik(lm, ref_logits, ctx, cont)[0], abs=2e-4)
        correct.append(float(np.argmax(lls) == s["doc"]["label"]))
    assert res["results"]["jaxsocial_test_mc"]["acc,none"] == pytest.approx(np.mean(correct))
    assert np.isfinite(res["results"]["jaxsocial_test_ppl"]["word_perplexity,none"])


def test_cli_arg_string(checkpoint):
    lm = get_model("jaxsocial").create_from_arg_string(
        f"checkpoint={checkpoint},max_gen_toks=8,seed=1", {"batch_size": 2, "device": "cpu"})
    assert lm.batch_size == 2 and lm.max_gen_toks == 8


# ---------------------------------------------------------------------------------------------
# Agreement with lm-eval's own HF backend on the same checkpoint and requests


def _hf_backend(path):
    from lm_eval.models.huggingface import HFLM
    return HFLM(pretrained=path, device="cpu", batch_size=4, dtype="float32")


def _agree(ours, theirs, prompts):
    for s in prompts + ["<|begin_of_text|>already prefixed", ""]:
        assert ours.tok_encode(s) == theirs.tok_encode(s), s
    pairs = [(p, " yes") for p in prompts] + [("Hello", " world")]
    reqs = [_req("loglikelihood", p, i) for i, p in enumerate(pairs)]
    for (a, ga), (b, gb) in zip(ours.loglikelihood(reqs), theirs.loglikelihood(reqs)):
        assert a == pytest.approx(b, abs=2e-4) and ga == gb
    gens = [_req("generate_until", (p, {"until": ["\n\n"], "max_gen_toks": 10,
                                        "do_sample": False}), i) for i, p in enumerate(prompts)]
    assert ours.generate_until(gens) == theirs.generate_until(gens)


def test_agrees_with_lm_evals_hf_backend_on_the_tiny_llama(lm, checkpoint):
    _agree(lm, _hf_backend(checkpoint), [PROMPT, "The sky is", "def f(x):\n    return"])


def test_agrees_with_lm_evals_hf_backend_with_smollm2s_tokenizer(tmp_path):
    """SmolLM2's tokenizer adds no special tokens by default (its BOS is <|im_start|>): a
    wrapper that prepended BOS anyway saw another context than lm-eval's HF backend."""
    pytest.importorskip("gguf")
    import hf_utils

    from jaxsocial.models import zoo
    tok = checkpoint_hf.load_tokenizer(zoo.smollm2_135m_instruct())
    hf_utils.save_random_hf_model(tmp_path, seed=5, vocab_size=len(tok), bos_token_id=1,
                                  eos_token_id=2, pad_token_id=2)
    tok.save_pretrained(tmp_path)
    ours = lm_eval_model.JaxSocialLM(checkpoint=str(tmp_path), batch_size=4)
    theirs = _hf_backend(str(tmp_path))
    prompts = [PROMPT, "def add(a, b):\n    return"]
    assert ours.tok_encode(PROMPT)[0] != tok.bos_token_id  # no BOS, as the tokenizer does it
    _agree(ours, theirs, prompts)
    # Negative control: the old wrapper, which prepended BOS to every sequence, is rejected.
    plain = ours.tok_encode

    def old_encode(string, add_special_tokens=None, left_truncate_len=None, **kw):
        ids = plain(string, add_special_tokens=False)
        if add_special_tokens is not False and (not ids or ids[0] != tok.bos_token_id):
            ids = [tok.bos_token_id] + ids
        return ids[-left_truncate_len:] if left_truncate_len else ids
    ours.tok_encode = old_encode
    with pytest.raises(AssertionError):
        _agree(ours, theirs, prompts)
