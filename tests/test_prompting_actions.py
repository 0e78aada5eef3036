"""Agent action grammar and parser; prompt-template input checks. (The jit prompt assembly
against the tokenizers' own chat-template ids: tests/test_prompting_canonical.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.agents import actions as agent_actions
from jaxsocial.agents import prompting
from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.models.tokenizer import tiny_tokenizer
from jaxsocial.social.actions import ActionType
from jaxsocial.social.state import PAD_TOKEN

PERSONAS = ["You are Ada, an engineer.", "You are Bo, a cook who loves soup!"]
INSTRUCTION = "Pick one action for your feed."
FOOTER = "Your action:"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_template_rejects_untrimmed_persona(tok):
    with pytest.raises(ValueError, match="persona 0"):
        prompting.PromptTemplate.build(tok, [" padded "], INSTRUCTION, FOOTER, 2, 8)


@pytest.fixture(scope="module")
def vocab(tok):
    return agent_actions.ActionVocab.build(
        tok, ["post", "comment", "like", "follow", "nothing"], feed_size=3,
        stop_ids=[tok.convert_tokens_to_ids("<|eot_id|>")])


def _encode_answer(tok, text, n=16):
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    ids = tok.encode(text, add_special_tokens=False) + [eot]
    out = np.zeros(n, np.int32)
    out[:len(ids)] = ids
    return out, np.arange(n) < len(ids)


def test_parser_maps_answers_to_society_actions(tok, vocab):
    answers = ["like 2", "post: soup for everyone", "comment 3: nice", "follow 1", "nothing",
               "I refuse", "like 9"]
    rows = [_encode_answer(tok, a, n=24) for a in answers]
    tokens = jnp.asarray(np.stack([r[0] for r in rows]))
    mask = jnp.asarray(np.stack([r[1] for r in rows]))
    p = agent_actions.parse(vocab, tokens, mask, content_len=14)
    t = [int(x) for x in p.type]
    assert t == [ActionType.LIKE_POST, ActionType.CREATE_POST, ActionType.CREATE_COMMENT,
                 ActionType.FOLLOW, ActionType.DO_NOTHING, ActionType.MALFORMED,
                 ActionType.MALFORMED]
    assert [int(x) for x in p.feed_pos[:5]] == [1, -1, 2, 0, -1]
    content = np.asarray(p.content)
    assert tok.decode(content[1][content[1] >= 0]) == " soup for everyone"
    assert tok.decode(content[2][content[2] >= 0]) == " nice"
    assert (content[0] == PAD_TOKEN).all()
    # Right-padded with PAD_TOKEN, never with a real id (id 0 is "!" in Llama-3).
    assert (content[1][len(tok.encode(" soup for everyone", add_special_tokens=False)):]
            == PAD_TOKEN).all()
    feed_ids = jnp.asarray([[10, 11, 12]] * 7)
    feed_valid = jnp.asarray([[True, True, False]] * 7)
    authors = jnp.asarray([[100, 101, 102]] * 7)
    acts = agent_actions.to_actions(p, jnp.arange(7), feed_ids, feed_valid, authors,
                                    jnp.zeros((7, 4)))
    # like 2 -> post 11; comment 3 hits an empty feed slot -> EMPTY; follow 1 -> author 100.
    assert [int(x) for x in acts.target[:4]] == [11, -1, -1, 100]


def test_grammar_only_emits_parsable_answers(tok, vocab):
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    g = vocab.grammar(len(tok), max_text_tokens=6, exclude_from_text=range(6))
    # Random walks through the FSM: every accepted sequence must parse.
    key = jax.random.key(0)
    b, n = 64, 16
    state = jnp.full((b,), g.start)
    toks, masks = [], []
    done = jnp.zeros((b,), bool)
    for t in range(n):
        key, sub = jax.random.split(key)
        logits = jnp.where(g.allowed[state], 0.0, -1e30)
        tok_t = jax.random.categorical(sub, logits)
        live = ~done
        toks.append(jnp.where(live, tok_t, 0))
        masks.append(live)
        done = done | (live & (tok_t == eot))
        state = grammar_lib.advance(g, state, tok_t, live)
    tokens, mask = jnp.stack(toks, 1), jnp.stack(masks, 1)
    assert bool(done.all())
    assert bool(grammar_lib.accepts(g, tokens, mask).all())
    p = agent_actions.parse(vocab, tokens, mask, content_len=8)
    assert bool(p.parsed.all())
