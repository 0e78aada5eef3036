"""The one chat engine (`jaxsocial.agents.chat.ChatModel`) on the tiny random Llama and the
committed tiny tokenizer: encode is the tokenizer's chat template left-padded, greedy `complete`
is `jaxsocial.generation.generate` called directly, per-row caps and batch padding change no
row, and the three engines (LLMAgent, SkillLLM, JaxSocialLM) hold one."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial import generation
from jaxsocial.agents import chat as chat_lib
from jaxsocial.models import loading

CONVS = [chat_lib.messages("hi", "You are terse."),
         chat_lib.messages("a longer question about arms, rounds and tokens " * 2),
         chat_lib.messages("x", "sys")]
N = 8


@pytest.fixture(scope="module")
def chat():
    # seed 3: greedy answers that depend on the prompt, some ending on a stop id before N
    return chat_lib.ChatModel.load("tiny", seed=3)


def test_messages_leave_out_an_empty_system():
    assert chat_lib.messages("u") == [{"role": "user", "content": "u"}]
    assert chat_lib.messages("u", "s") == [{"role": "system", "content": "s"},
                                           {"role": "user", "content": "u"}]


def test_token_ids_follow_the_loaders_rule(chat):
    stop, eot, pad = loading.chat_token_ids(chat.tokenizer, chat.model.config)
    assert chat.stop_ids == stop and chat.eot == eot and chat.pad == pad
    assert chat.eot in chat.stop_ids
    with pytest.raises(ValueError, match="nothing to load"):
        chat_lib.ChatModel.load("")


def test_encode_is_the_chat_template_left_padded(chat):
    ids, mask = chat.encode(CONVS)
    texts = [chat.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
             for c in CONVS]
    rows = [chat.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    length = max(len(r) for r in rows)
    assert ids.shape == mask.shape == (len(CONVS), length)
    assert ids.dtype == np.int32 and mask.dtype == np.int32
    for b, r in enumerate(rows):
        pad = length - len(r)
        assert ids[b, pad:].tolist() == r and (mask[b, pad:] == 1).all()
        assert (ids[b, :pad] == chat.pad).all() and (mask[b, :pad] == 0).all()
    assert len(set(len(r) for r in rows)) == len(rows)  # the padding above was exercised
    # the generation prompt is there: the text ends with the assistant header
    assert texts[0].startswith("<|begin_of_text|>") and "You are terse." in texts[0]
    assert texts[0].rstrip().endswith("<|start_header_id|>assistant<|end_header_id|>")


def _direct(chat, convs, max_new_tokens, key):
    """Greedy tokens and texts from `jaxsocial.generation.generate` itself."""
    ids, mask = chat.encode(convs)
    cfg = generation.SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0,
                                    stop_token_ids=chat.stop_ids)
    out = generation.generate(chat.model, jnp.asarray(ids), jnp.asarray(mask), key, cfg)
    toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
    texts = [chat.tokenizer.decode(toks[b, :lens[b]].tolist(), skip_special_tokens=True)
             for b in range(len(convs))]
    return toks, lens, texts


def test_greedy_complete_is_generate_called_directly(chat):
    key = jax.random.key(0)
    got = chat.complete(CONVS, key, N, temperature=0.0)
    toks, lens, texts = _direct(chat, CONVS, N, key)
    assert got.tokens.shape == (len(CONVS), N) and got.lengths.dtype == np.int32
    np.testing.assert_array_equal(got.tokens, toks)
    np.testing.assert_array_equal(got.lengths, lens)
    assert got.texts == texts and all(texts)
    assert 0 < got.stopped.sum() < len(CONVS)  # both kinds of row
    assert got.stopped.tolist() == [bool(n and toks[b, n - 1] in chat.stop_ids)
                                    for b, n in enumerate(lens)]
    # negative controls: a shorter decode, or another prompt, gives another answer
    short = chat.complete(CONVS, key, N // 2, temperature=0.0)
    assert short.texts != got.texts and (short.lengths <= N // 2).all()
    other = chat.complete([chat_lib.messages("bye")] + CONVS[1:], key, N, temperature=0.0)
    assert other.texts[0] != got.texts[0] and other.texts[1:] == got.texts[1:]


def test_caps_cut_rows_as_a_shorter_call_would(chat):
    key = jax.random.key(0)
    full = chat.complete(CONVS, key, N, temperature=0.0)
    short = chat.complete(CONVS, key, N // 2, temperature=0.0)
    capped = chat.complete(CONVS, key, N, caps=[N // 2] * 3, temperature=0.0)
    np.testing.assert_array_equal(capped.lengths, np.minimum(full.lengths, N // 2))
    assert capped.texts == short.texts  # decoding is causal
    mixed = chat.complete(CONVS, key, N, caps=[N, 1, N // 2], temperature=0.0)
    assert mixed.texts[0] == full.texts[0] and mixed.texts[2] == short.texts[2]
    assert mixed.lengths[1] == 1


def test_pad_batch_drops_its_rows_and_changes_no_row(chat):
    key = jax.random.key(0)
    plain = chat.complete(CONVS, key, N, temperature=0.0)
    padded = chat.complete(CONVS, key, N, temperature=0.0, pad_batch=True)  # 3 -> 4 rows
    assert len(padded.texts) == 3 and padded.tokens.shape == (3, N)
    assert padded.texts == plain.texts
    with pytest.raises(ValueError, match="at least one"):
        chat.complete([], key, N)


def test_sampling_follows_the_key(chat):
    a = chat.complete(CONVS, jax.random.key(1), N, temperature=1.0)
    b = chat.complete(CONVS, jax.random.key(1), N, temperature=1.0)
    c = chat.complete(CONVS, jax.random.key(2), N, temperature=1.0)
    assert a.texts == b.texts and a.texts != c.texts


def test_sampling_config_adds_stop_ids_sorted(chat):
    cfg = chat.sampling(5, [7, chat.stop_ids[0]], temperature=0.5)
    assert cfg.stop_token_ids == tuple(sorted(set(chat.stop_ids) | {7}))
    assert cfg.max_new_tokens == 5 and cfg.temperature == 0.5
    assert cfg.prompt_bucket == generation.SamplingConfig().prompt_bucket


def test_the_agents_and_skill_engines_hold_one_chat_model(chat):
    from jaxsocial.envs import llm_agent, skill_llm

    agent = llm_agent.LLMAgent.from_chat(chat, llm_agent.LLMAgentConfig(temperature=0.0,
                                                                        prompt_bucket=64))
    assert agent.chat is chat and agent.model is chat.model
    assert (agent.stop_ids, agent.eot, agent.pad) == (chat.stop_ids, chat.eot, chat.pad)
    key = jax.random.key(0)
    texts, lengths, truncated = agent.complete(["hi"], key, N)
    want = chat.complete([chat_lib.messages("hi", llm_agent.SYSTEM_PROMPT)], key, N,
                         temperature=0.0)
    assert texts == want.texts and lengths.tolist() == want.lengths.tolist()
    assert truncated.tolist() == [bool(not want.stopped[0] and want.lengths[0] >= N)]

    llm = skill_llm.SkillLLM.from_chat(chat, skill_llm.RunConfig(prompt_bucket=64))
    out, tok = llm.complete([("You are terse.", "hi"), ("", "x")], key, [N, 0],
                            temperature=0.0)
    assert out[0] == chat.complete(CONVS[:1], key, N, temperature=0.0).texts[0]
    assert out[1] == "" and tok[1] == 0 and llm.calls == 1


def test_the_lm_eval_model_holds_one_too(chat):
    pytest.importorskip("lm_eval")
    from jaxsocial.eval import lm_eval_model

    lm = lm_eval_model.JaxSocialLM(model=chat.model, tokenizer=chat.tokenizer, batch_size=2)
    assert lm.chat.model is chat.model and lm.stop_token_ids == chat.stop_ids
    ids = chat.token_ids("hello there")
    assert lm.tok_decode(ids) == chat.decode(ids) == "hello there"
