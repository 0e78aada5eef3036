"""One embedding space grounded in text: crowd posts' embeddings are the frozen encoder's
embeddings of the exact tokens agents see; agents' interests are their persona embeddings; crowd
interests sit at their topic descriptions."""
import functools
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.social import society, text_bank
from jaxsocial.social.state import PAD_TOKEN, PostKind
from jaxsocial.train import host, sharding
from jaxsocial.train import run as run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-5


def load_config(name, arg=None):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


@pytest.fixture(scope="module")
def grounded():
    """demo:smoke run: its initial society and the society after one rollout (agent ticks +
    settle ticks) plus three crowd-only ticks with more crowd posting, so that posts, comments
    and quotes all occur."""
    c = load_config("demo", "smoke")
    c.crowd_text.topics = ()  # every topic (the demo keeps one): crowd interests span 14 topics
    # One device: this is about text, not sharding (an epoch over 8 fake devices costs ~10x).
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state = run.init_state()
    soc0 = state.society
    soc, _ = run.rollout(state.train.params, state.train.ref_params, soc0, jax.random.key(1))
    busy = run.setup.social_params.replace(p_post=0.3, p_comment=0.3, p_quote=0.3)
    step = jax.jit(lambda k, s: society.step(k, s, None, busy)[0])
    for k in jax.random.split(jax.random.key(2), 3):
        soc = step(k, soc)
    return run, state, soc0, soc


def _crowd_created(run, soc0, soc):
    """Slots of posts the crowd created after reset (reposts copy their original: excluded)."""
    p = soc.posts
    ids, author, kind = np.asarray(p.id), np.asarray(p.author), np.asarray(p.kind)
    return np.nonzero((ids >= int(soc0.posts.next_id)) & (author >= run.setup.num_agents)
                      & (kind != PostKind.REPOST))[0]


def _embed_stored(run, state, tokens):
    return np.asarray(run.fns.embed(state.train.ref_params, run.encoder, jnp.asarray(tokens)))


def test_bank_has_300_posts_over_12_topics(grounded):
    run, *_ = grounded
    corpus = text_bank.load_corpus()
    assert len(corpus.posts) >= 300 and len(set(corpus.post_topic)) >= 12
    assert run.text.crowd_text.posts.size == len(corpus.posts)
    assert len(np.unique(np.asarray(run.text.crowd_text.posts.topic))) >= 12
    assert len(set(corpus.interest_topic)) == len(corpus.topics)
    for topic in range(len(corpus.topics)):  # several descriptions per topic
        assert corpus.interest_topic.count(topic) >= 3
    words = [len(t.split()) for t in corpus.posts]
    assert min(words) >= 8 and max(words) <= 25
    assert len(set(corpus.posts)) == len(corpus.posts)


def test_bank_tokens_are_leading_space_form_right_padded(grounded):
    run, *_ = grounded
    corpus = text_bank.load_corpus()
    toks = np.asarray(run.text.crowd_text.posts.tokens)
    L = run.setup.social_params.content_len
    assert toks.shape == (len(corpus.posts), L)
    for i in (0, 17, 123):
        want = run.setup.tokenizer.encode(" " + corpus.posts[i], add_special_tokens=False)[:L]
        row = toks[i]
        assert list(row[row >= 0]) == want
        n = len(want)
        assert np.all(row[:n] >= 0) and np.all(row[n:] == PAD_TOKEN)


def test_crowd_post_embedding_is_the_encoder_embedding_of_its_tokens(grounded):
    run, state, soc0, soc = grounded
    slots = _crowd_created(run, soc0, soc)
    kinds = np.asarray(soc.posts.kind)[slots]
    assert len(slots) >= 10, len(slots)
    for k in (PostKind.POST, PostKind.COMMENT, PostKind.QUOTE):
        assert (kinds == k).any(), f"no crowd {k.name} in the sample"
    tokens = np.asarray(soc.posts.tokens)[slots]
    stored = np.asarray(soc.posts.embedding)[slots]
    assert np.all((tokens >= 0).sum(1) > 0)  # agents see real text
    recomputed = _embed_stored(run, state, tokens)
    err = np.abs(recomputed - stored).max(axis=1)
    assert err.max() < TOL, err.max()
    # Negative control: another post's tokens give another embedding.
    other = np.roll(np.arange(len(slots)), 1)
    differ = np.any(tokens != tokens[other], axis=1)
    assert differ.sum() >= len(slots) // 2
    wrong = np.abs(recomputed[other] - stored).max(axis=1)
    assert np.all(wrong[differ] > 1e-3), wrong[differ].min()


def test_seed_posts_are_bank_posts(grounded):
    run, state, soc0, _ = grounded
    p = soc0.posts
    seeds = np.nonzero(np.asarray(p.id) >= 0)[0]
    assert len(seeds) == run.setup.social_params.num_seed_posts
    tokens = np.asarray(p.tokens)[seeds]
    bank = np.asarray(run.text.crowd_text.posts.tokens)
    match = (tokens[:, None, :] == bank[None]).all(-1)  # [S, Nb]
    assert match.any(1).all()
    idx = match.argmax(1)
    np.testing.assert_allclose(np.asarray(p.embedding)[seeds],
                               np.asarray(run.text.crowd_text.posts.embedding)[idx], atol=TOL)
    np.testing.assert_allclose(_embed_stored(run, state, tokens),
                               np.asarray(p.embedding)[seeds], atol=TOL)


def test_agents_interests_are_their_persona_embeddings(grounded):
    run, state, soc0, _ = grounded
    a = run.setup.num_agents
    personas = [run.config.agents.personas[i % len(run.config.agents.personas)]
                for i in range(a)]
    want = _embed_stored(run, state, text_bank.tokenize(run.setup.tokenizer, personas))
    got = np.asarray(soc0.users.interest)[:a]
    np.testing.assert_allclose(got, want, atol=TOL)
    # Control: persona embeddings differ from one another.
    assert np.abs(want[0] - want[1]).max() > 1e-2


def test_crowd_interests_sit_at_their_topic_descriptions(grounded):
    run, state, soc0, _ = grounded
    a = run.setup.num_agents
    interest = np.asarray(soc0.users.interest)[a:]
    topic = np.asarray(soc0.users.persona)[a:]
    desc = np.asarray(run.text.interest_bank.embedding)
    desc_topic = np.asarray(run.text.interest_bank.topic)
    sim = interest @ desc.T  # [crowd, Nd]
    own = np.where(desc_topic[None] == topic[:, None], sim, -2).max(1)
    # interest_noise (0.3 in the demo) keeps each user within cos ~0.95 of a description of its
    # topic; random directions in d=16 are at |cos| ~ 0.25.
    assert np.mean(own > 0.8) > 0.95, np.mean(own > 0.8)
    assert len(np.unique(topic)) == len(set(desc_topic.tolist()))
    # Control: against a description of another topic the match is much worse.
    shuffled = np.where(desc_topic[None] == ((topic[:, None] + 1) % len(run.setup.topics)), sim,
                        -2).max(1)
    assert np.mean(shuffled > 0.8) < 0.5


def test_topic_metrics(grounded):
    run, *_ = grounded
    cent = np.asarray(run.text.topic_centroids)
    topics = functools.partial(host.topic_metrics, run.setup, run.text)
    m = topics(cent[[3, 3, 5]])
    assert m["topic_share"] == {run.setup.topics[3]: 2 / 3, run.setup.topics[5]: 1 / 3}
    assert topics(run.text.crowd_center[None])["crowd_interest_sim"] == pytest.approx(1.0)
    assert topics(np.zeros((0, cent.shape[1])))["topic_share"] == {}


def _toy_text(params, by_id, nb=7):
    """A small bank with random unit embeddings and distinct token rows."""
    L, d = params.content_len, params.embed_dim
    tokens = np.full((nb, L), PAD_TOKEN, np.int32)
    for i in range(nb):
        tokens[i, :i % L + 1] = 100 + i
    emb = np.array(jax.random.normal(jax.random.key(5), (nb, d)))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    bank = text_bank.make_bank(tokens, emb, np.arange(nb) % 3)
    return text_bank.CrowdText(posts=bank, comments=bank, temperature=jnp.float32(0.1),
                               by_id=by_id)


def _society_run(params, text, ticks=4):
    soc = society.reset(jax.random.key(0), params, text)
    step = jax.jit(lambda k, s: society.step(k, s, None, params)[0])
    for k in jax.random.split(jax.random.key(1), ticks):
        soc = step(k, soc)
    return soc


@pytest.mark.parametrize("by_id", [False, True])
def test_society_copies_bank_text(by_id):
    params = society.make_params(num_users=200, post_capacity=512, num_seed_posts=20,
                                 content_len=6, embed_dim=8, p_post=0.3, p_comment=0.2,
                                 p_quote=0.1, max_active=64, crowd_budget=256)
    text = _toy_text(params, by_id)
    soc = _society_run(params, text)
    p = soc.posts
    ids = np.asarray(p.id)
    own = (ids >= 0) & (np.asarray(p.kind) != PostKind.REPOST)
    assert own.sum() > 40
    tokens, emb = np.asarray(p.tokens)[own], np.asarray(p.embedding)[own]
    bank_tok, bank_emb = np.asarray(text.posts.tokens), np.asarray(text.posts.embedding)
    match = (tokens[:, None] == bank_tok[None]).all(-1)
    assert match.any(1).all()
    idx = match.argmax(1)
    np.testing.assert_allclose(emb, bank_emb[idx], atol=1e-6)
    if by_id:  # entry id % Nb (configs/code.py: problems stay addressable by post id)
        np.testing.assert_array_equal(idx, ids[own] % len(bank_tok))
    else:  # drawn by interest: the chosen entries are closer to the authors than chance
        author = np.asarray(p.author)[own]
        sim = np.sum(np.asarray(soc.users.interest)[author] * emb, axis=1)
        chance = (np.asarray(soc.users.interest)[author] @ bank_emb.T).mean(1)
        assert sim.mean() > chance.mean() + 0.2
        assert not np.array_equal(idx, ids[own] % len(bank_tok))


def test_text_free_society_keeps_pad_tokens():
    params = society.make_params(num_users=100, post_capacity=256, num_seed_posts=10,
                                 content_len=4, embed_dim=8, p_post=0.3, max_active=32,
                                 crowd_budget=128, pool_size=64)
    soc = _society_run(params, None, ticks=2)
    assert soc.text is None
    assert np.all(np.asarray(soc.posts.tokens) == PAD_TOKEN)


def test_bad_corpus_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"topics": [{"name": "x", "posts": ["a"], "comments": []}]}')
    with pytest.raises(ValueError, match="bad.json.*'x'.*comments"):
        text_bank.load_corpus(str(path))
    with pytest.raises(ValueError, match="unknown crowd topic 'nope'"):
        text_bank.topic_ids(text_bank.load_corpus(), ["nope"])
