"""Every OASIS action an LLM agent may take: each answer form goes through
the grammar (constrained mode), the parser (free mode) and the society, and changes the state
as that action should. Plus: action sets by config, errors naming a bad action."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.agents import actions as agent_actions
from jaxsocial.agents import prompting
from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.models.tokenizer import tiny_tokenizer
from jaxsocial.social import search, society
from jaxsocial.social.actions import ActionType as T
from jaxsocial.social.actions import Reason, make_actions
from jaxsocial.social.state import PAD_TOKEN, PostKind
from jaxsocial.train import checks
from jaxsocial.train import config as run_config

K, C, L = 3, 2, 16
PARAMS = society.make_params(num_users=12, num_agents=2, post_capacity=32, num_seed_posts=0,
                             feed_size=K, pool_size=4, embed_dim=8, content_len=L, crowd=False,
                             crowd_budget=8, init_following=0, feed_comments=C)
P0, P1, P2, C1, C0 = 0, 1, 2, 3, 4  # feed posts by users 5, 6, 7; C0 newest comment on P0
AUTHORS = (5, 6, 7)


def _tok_eot():
    tok = tiny_tokenizer()
    return tok, int(tok.convert_tokens_to_ids("<|eot_id|>"))


def _content(tok, text):
    ids = tok.encode(" " + text, add_special_tokens=False)
    out = np.full((L,), PAD_TOKEN, np.int32)
    out[:len(ids)] = ids
    return out


@pytest.fixture(scope="module")
def world():
    tok, eot = _tok_eot()
    step = jax.jit(lambda s, b: society.step(jax.random.key(0), s, b, PARAMS))
    st = society.reset(jax.random.key(0), PARAMS)
    words = [_content(tok, w) for w in ("soup", "code", "rain", "yes", "no")]
    st, _ = step(st, make_actions(PARAMS, [T.CREATE_POST] * 3, list(AUTHORS), None,
                                  np.stack(words[:3]), np.eye(3, 8)))
    st, _ = step(st, make_actions(PARAMS, [T.CREATE_COMMENT] * 2, [9, 8], [P0, P0],
                                  np.stack(words[3:]), np.eye(2, 8)))
    vocab = agent_actions.ActionVocab.build(tok, "all", K, [eot], feed_comments=C)
    g = vocab.grammar(len(tok), max_text_tokens=8, exclude_from_text=[eot])
    return tok, eot, step, st, vocab, g


# answer -> (setup actions of agent 0 as (type, target), check(before, after, info))
def _post(b, a, i):
    new = int(i.agent.created_id[0])
    return (new >= 0 and int(a.posts.kind[new]) == PostKind.POST
            and int(a.posts.author[new]) == 0 and (np.asarray(a.posts.tokens[new]) >= 0).any())


def _counter(field, slot, delta):
    return lambda b, a, i: (int(getattr(a.posts, field)[slot])
                            - int(getattr(b.posts, field)[slot])) == delta


def _created(kind, parent, counter):
    def check(b, a, i):
        new = int(i.agent.created_id[0])
        return (new >= 0 and int(a.posts.kind[new]) == kind and int(a.posts.parent[new]) == parent
                and _counter(counter, parent, 1)(b, a, i))
    return check


def _in_row(field, user, present):
    return lambda b, a, i: (user in np.asarray(getattr(a.graph, field)[0]).tolist()) == present


def _inbox(fn):
    def check(b, a, i):
        want = np.asarray(fn(a.replace(tick=a.tick - 1), i))
        return bool(a.inbox.pending[0]) and np.asarray(a.inbox.ids[0]).tolist() == want.tolist()
    return check


def _unchanged(b, a, i):
    return (np.array_equal(np.asarray(a.posts.likes), np.asarray(b.posts.likes))
            and int(a.posts.next_id) == int(b.posts.next_id)
            and np.array_equal(np.asarray(a.graph.following), np.asarray(b.graph.following)))


QUERY = np.linspace(-1, 1, 8).astype(np.float32)
CASES = {
    "post: hello there": ([], _post),
    "comment 1: nice": ([], _created(PostKind.COMMENT, P0, "comments")),
    "quote 2: wow": ([], _created(PostKind.QUOTE, P1, "quotes")),
    "repost 3": ([], _created(PostKind.REPOST, P2, "reposts")),
    "like 1": ([], _counter("likes", P0, 1)),
    "unlike 1": ([(T.LIKE_POST, P0)], _counter("likes", P0, -1)),
    "dislike 2": ([], _counter("dislikes", P1, 1)),
    "undo_dislike 2": ([(T.DISLIKE_POST, P1)], _counter("dislikes", P1, -1)),
    "report 3": ([], _counter("reports", P2, 1)),
    "follow 1": ([], _in_row("following", 5, True)),
    "unfollow 1": ([(T.FOLLOW, 5)], _in_row("following", 5, False)),
    "mute 2": ([], _in_row("muted", 6, True)),
    "unmute 2": ([(T.MUTE, 6)], _in_row("muted", 6, False)),
    # comment labels: post 1's comments are [4] (newest, C0) and [5] (C1)
    "like_comment 4": ([], _counter("likes", C0, 1)),
    "unlike_comment 4": ([(T.LIKE_COMMENT, C0)], _counter("likes", C0, -1)),
    "dislike_comment 5": ([], _counter("dislikes", C1, 1)),
    "undo_dislike_comment 5": ([(T.DISLIKE_COMMENT, C1)], _counter("dislikes", C1, -1)),
    "search_posts: soup": ([], _inbox(lambda s, i: search.search_posts(
        s, jnp.asarray(QUERY[None]), PARAMS, K)[0][0])),
    "search_user: cook": ([], _inbox(lambda s, i: search.search_user(
        s, jnp.asarray(QUERY[None]), jnp.asarray([0]), PARAMS, K)[0][0])),
    "trend": ([], _inbox(lambda s, i: search.trend(s, PARAMS, K))),
    "refresh": ([], _unchanged),
    "nothing": ([], _unchanged),
}


def test_every_action_walks_grammar_parser_society(world):
    tok, eot, step, st0, vocab, g = world
    keywords = {a.split(":")[0].split(" ")[0] for a in CASES}
    assert keywords == set(agent_actions.ACTIONS)  # every action has a case
    answers = list(CASES)
    rows = [tok.encode(a, add_special_tokens=False) + [eot] for a in answers]
    n = max(map(len, rows))
    ids = np.zeros((len(rows), n), np.int32)
    mask = np.zeros((len(rows), n), bool)
    for r, x in enumerate(rows):
        ids[r, :len(x)], mask[r, :len(x)] = x, True
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    assert np.asarray(grammar_lib.accepts(g, ids, mask)).all()  # constrained mode emits them
    parsed = agent_actions.parse(vocab, ids, mask, L)  # free mode parses them
    assert np.asarray(parsed.parsed).all()
    slots = jnp.asarray([[P0, P1, P2]])
    view = prompting.feed_view(st0.posts, slots, jnp.ones((1, K), bool), C)
    assert np.asarray(view.comment_ids[0, 0]).tolist() == [C0, C1]
    b = len(answers)
    acts = agent_actions.to_actions(
        parsed, jnp.zeros((b,), jnp.int32), jnp.tile(jnp.asarray([[P0, P1, P2]]), (b, 1)),
        jnp.ones((b, K), bool), jnp.tile(jnp.asarray([AUTHORS]), (b, 1)),
        jnp.tile(jnp.asarray(QUERY[None]), (b, 1)), jnp.tile(view.comment_ids, (b, 1, 1)))
    for r, answer in enumerate(answers):
        setup, check = CASES[answer]
        st = st0
        if setup:
            st, info = step(st, make_actions(PARAMS, [setup[0][0]], [0], [setup[0][1]]))
            assert int(info.agent.reason[0]) == Reason.OK, answer
        row = jax.tree.map(lambda x: x[r:r + 1], acts)
        assert int(row.type[0]) == int(agent_actions.ACTIONS[answer.split(":")[0].split(" ")[0]]
                                       .type), answer
        after, info = step(st, row)
        assert int(info.agent.reason[0]) == Reason.OK, (answer, int(info.agent.reason[0]))
        assert int(info.agent.type_counts[int(row.type[0])]) == 1, answer
        assert check(st, after, info), answer


def test_malformed_answers_are_counted_not_fatal(world):
    tok, eot, step, st0, vocab, g = world
    bad = ["likes 1", "like_comment 1", "search_posts:", "Trend", "unfollow 9"]
    rows = [tok.encode(a, add_special_tokens=False) + [eot] for a in bad]
    n = max(map(len, rows))
    ids = np.zeros((len(rows), n), np.int32)
    mask = np.zeros((len(rows), n), bool)
    for r, x in enumerate(rows):
        ids[r, :len(x)], mask[r, :len(x)] = x, True
    assert not np.asarray(grammar_lib.accepts(g, jnp.asarray(ids), jnp.asarray(mask))).any()
    p = agent_actions.parse(vocab, jnp.asarray(ids), jnp.asarray(mask), L)
    assert np.asarray(p.type).tolist() == [int(T.MALFORMED)] * len(bad)


def test_action_sets_by_config_and_errors_name_the_bad_action():
    tok, eot = _tok_eot()
    assert agent_actions.resolve("oasis_twitter") == ("post", "like", "repost", "follow",
                                                      "nothing", "quote")
    assert agent_actions.resolve(["create_post", "like_post", "do_nothing", "trend"]) == (
        "post", "like", "nothing", "trend")
    assert agent_actions.resolve(run_config.base_config().agents.actions) == (
        agent_actions.PRESETS["default"])
    with pytest.raises(ValueError, match="'share_post'"):
        agent_actions.ActionVocab.build(tok, ["post", "share_post"], K, [eot])
    with pytest.raises(ValueError, match="'oasis'"):
        agent_actions.resolve("oasis")
    with pytest.raises(ValueError, match="feed_comments"):
        agent_actions.ActionVocab.build(tok, "oasis_reddit", K, [eot])
    c = run_config.smoke(run_config.base_config())
    c.agents.actions = ("post", "like", "teleport")
    with pytest.raises(ValueError, match="'teleport'"):
        checks.check(c)
    c.agents.actions = agent_actions.PRESETS["oasis_reddit"]
    with pytest.raises(ValueError, match="society.feed_comments"):
        checks.check(c)
    c.society.feed_comments = 2
    checks.check(c)
