"""`society.encoder="minilm"`: everything the society compares is all-MiniLM-L6-v2's sentence
embedding of the text agents read.

The rollout's and the text banks' embeddings go policy tokens -> text -> WordPiece -> encoder
(`train.society_encoder`, a host callback inside the compiled rollout). They are checked
against `SentenceEncoder.encode` of the decoded text, the path that matches transformers'
BertModel (tests/test_encoder.py). The negative control re-tokenizes with one policy token
dropped; the same comparison rejects it.
"""
import jax
import numpy as np
import pytest
from conftest import load_config_file

from jaxsocial.models import encoder as encoder_lib
from jaxsocial.models import zoo
from jaxsocial.social.state import PAD_TOKEN, PostKind
from jaxsocial.train import checks, sharding, society_encoder
from jaxsocial.train import run as run_lib

TOL = 1e-5


def minilm_smoke():
    c = load_config_file("configs/demo.py", "smoke")
    c.society.encoder = "minilm"
    c.society.embed_dim = 384
    c.crowd_text.topics = ()  # every topic: the banks span all 14
    return c


@pytest.fixture(scope="module")
def rolled():
    """demo:smoke with the MiniLM society, on one device: the run, its initial state, and the
    society after one rollout (agent ticks + settle ticks)."""
    run = run_lib.build_run(minilm_smoke(), mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state = run.init_state()
    calls = run.setup.encoder.retokenizer.calls
    soc, ro = run.rollout(state.train.params, state.train.ref_params, state.society,
                           jax.random.key(1))
    jax.block_until_ready(ro.embedding)
    return run, state, soc, ro, run.setup.encoder.retokenizer.calls - calls


@pytest.fixture(scope="module")
def enc():
    return encoder_lib.SentenceEncoder.from_pretrained(zoo.minilm_l6_v2())


def _texts(run, rows):
    return run.setup.encoder.retokenizer.texts(np.asarray(rows))


def test_every_live_post_is_the_encoder_embedding_of_its_text(rolled, enc):
    run, state, soc, _, _ = rolled
    p = soc.posts
    ids, author = np.asarray(p.id), np.asarray(p.author)
    kind = np.asarray(p.kind)
    live = np.nonzero((ids >= 0) & (kind != PostKind.REPOST))[0]
    by_agents = live[author[live] < run.setup.num_agents]
    assert len(by_agents) > 0 and len(live) > len(by_agents)  # agents' and crowd posts
    texts = _texts(run, np.asarray(p.tokens)[live])
    want = enc.encode(texts)
    got = np.asarray(p.embedding)[live]
    assert got.shape[1] == 384
    np.testing.assert_allclose(got, want, atol=TOL)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_rollout_embeddings_and_persona_interests(rolled, enc):
    run, state, soc, ro, calls = rolled
    # One host round trip per agent tick of the compiled rollout.
    assert calls == int(run.config.rollout.ticks_per_epoch)
    personas = [run.config.agents.personas[i % len(run.config.agents.personas)]
                for i in range(run.setup.num_agents)]
    np.testing.assert_allclose(np.asarray(run.text.agent_interest), enc.encode(personas), atol=TOL)
    # The agents' answers: each created post's stored embedding is the rollout's embedding.
    created = np.asarray(ro.created_id).reshape(-1)
    emb = np.asarray(ro.embedding).reshape(created.shape[0], -1)
    ids, kind = np.asarray(soc.posts.id), np.asarray(soc.posts.kind)
    slot = {int(i): k for k, i in enumerate(ids) if i >= 0 and kind[k] != PostKind.REPOST}
    rows = [(r, slot[int(c)]) for r, c in enumerate(created) if c >= 0 and int(c) in slot]
    assert rows
    stored = np.asarray(soc.posts.embedding)
    for r, k in rows:
        np.testing.assert_allclose(emb[r], stored[k], atol=TOL)


def test_retokenizer_off_by_one_is_rejected(rolled, enc):
    """Negative control: dropping the last policy token of each row before re-tokenizing moves
    the embeddings far beyond the tolerance the tests above hold."""
    run, state, soc, _, _ = rolled
    rows = np.asarray(run.text.crowd_text.posts.tokens[:16])

    class DropLast(society_encoder.Retokenizer):
        def texts(self, content):
            cut = np.where(np.arange(content.shape[1])[None] < (content != PAD_TOKEN).sum(1,
                           keepdims=True) - 1, content, PAD_TOKEN)
            return super().texts(cut)

    broken = DropLast(run.setup.tokenizer, zoo.minilm_l6_v2(), 256, 0)
    good = np.asarray(jax.jit(lambda p, x: society_encoder.minilm_embed(
        run.setup.encoder.graphdef, run.setup.encoder.retokenizer, p, x))(run.encoder, rows))
    bad = np.asarray(jax.jit(lambda p, x: society_encoder.minilm_embed(
        run.setup.encoder.graphdef, broken, p, x))(run.encoder, rows))
    want = enc.encode(_texts(run, rows))
    np.testing.assert_allclose(good, want, atol=TOL)
    assert np.abs(bad - want).max() > 100 * TOL


def test_banks_have_topic_semantics(rolled):
    """The crowd's space means something: a bank post is closer to its own topic's interest
    descriptions than to the other topics' (random features would not separate them)."""
    run, *_ = rolled
    posts = np.asarray(run.text.crowd_text.posts.embedding)
    topic = np.asarray(run.text.crowd_text.posts.topic)
    cen = np.asarray(run.text.topic_centroids)
    sim = posts @ cen.T
    own = sim[np.arange(len(topic)), topic]
    other = (sim.sum(1) - own) / (cen.shape[0] - 1)
    acc = (np.argmax(sim, 1) == topic).mean()
    assert (own - other).mean() > 0.1 and acc > 0.5, ((own - other).mean(), acc)


@pytest.mark.parametrize("encoder, dim, needle", [
    ("minilm", 16, "society.encoder='minilm' embeds in 384 dimensions: set "
                   "society.embed_dim=384 (got 16)"),
    ("bert", 384, "society.encoder='bert'; choose one of ('reference', 'minilm')"),
])
def test_bad_encoder_config_is_one_line(encoder, dim, needle):
    c = load_config_file("configs/demo.py", "smoke")
    c.society.encoder, c.society.embed_dim = encoder, dim
    with pytest.raises(ValueError) as e:
        checks.check(c)
    assert needle in str(e.value)
    c.society.encoder, c.society.embed_dim = "minilm", 384  # the passing control
    checks.check(c)
