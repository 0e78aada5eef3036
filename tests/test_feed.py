"""The agents' feed as OASIS composes it: recommended posts plus the followees'
most-liked recent posts, each post with up to `feed_comments` of its comments, against
brute-force NumPy references over the whole state (which also checks the author and comment
chains `apply_actions` keeps)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.agents import prompting
from jaxsocial.models.tokenizer import tiny_tokenizer
from jaxsocial.social import recsys, society
from jaxsocial.social.actions import ActionType as T
from jaxsocial.social.actions import make_actions
from jaxsocial.social.state import PAD_TOKEN, PostKind

A = 4  # LLM agents


def _follow_params(**kw):
    base = dict(num_users=40, num_agents=A, post_capacity=64, num_seed_posts=40,
                seed_max_age=6, feed_size=6, pool_size=16, embed_dim=8, max_following=8,
                init_following=6, crowd=False, crowd_budget=32, feed_following=3,
                following_depth=3, following_window=5, max_muted=4)
    base.update(kw)
    return society.make_params(**base)


def _ref_following(st, u, params, exclude):
    """Followees' D newest posts / reposts / quotes (by scanning every slot), then the filters
    and the (likes desc, id desc) order of `recsys.following_posts`."""
    p = jax.tree.map(np.asarray, st.posts)
    live = (p.id >= 0) & (p.id >= int(p.next_id) - p.id.shape[0])
    cands = []
    for f in np.asarray(st.graph.following[u]):
        if f < 0:
            continue
        mine = np.flatnonzero(live & (p.author == f) & (p.kind != PostKind.COMMENT))
        mine = mine[np.argsort(-p.id[mine])][:params.following_depth]
        cands += list(mine)
    muted = set(np.asarray(st.graph.muted[u]).tolist()) - {-1}
    seen = set(np.asarray(st.memory.seen[u]).tolist()) - {-1}
    keep = [s for s in cands if p.kind[s] in (PostKind.POST, PostKind.QUOTE)
            and int(st.tick) - p.created_at[s] < params.following_window
            and p.author[s] not in muted and p.id[s] not in seen and p.id[s] not in exclude]
    keep.sort(key=lambda s: (-p.likes[s], -p.id[s]))
    return [int(p.id[s]) for s in keep[:params.feed_following]]


def test_feed_composes_recommended_and_followees_most_liked_posts():
    params = _follow_params()
    key = jax.random.key(0)
    st = society.reset(key, params)
    # each agent mutes one of its followees, so the mute filter matters
    row = np.asarray(st.graph.following[:A])
    muted = np.array(st.graph.muted)
    for a in range(A):
        muted[a, 0] = row[a][row[a] >= 0][0]
    st = st.replace(graph=st.graph.replace(muted=jnp.asarray(muted)))
    step = jax.jit(lambda s, b: society.step(key, s, b, params)[0])
    users = jnp.arange(A, dtype=jnp.int32)
    both = jax.jit(lambda k, s: (recsys.recommend(k, s, users, params),
                                 society.feed(k, s, users, params)))
    rng = np.random.default_rng(0)
    checked = 0
    for t in range(8):  # posts / reposts / quotes (several per author per batch) and likes
        n = int(st.posts.next_id)
        b = 24
        types = rng.choice([T.CREATE_POST, T.REPOST, T.QUOTE_POST, T.LIKE_POST, T.LIKE_POST], b)
        target = rng.integers(max(0, n - 64), n, b)
        st = step(st, make_actions(params, types, rng.integers(0, 12, b), target,
                                   embedding=rng.normal(size=(b, 8))))
        if t == 4:  # some posts already seen by the agents
            seen = np.array(st.memory.seen)
            seen[:A, :6] = rng.integers(max(0, n - 64), n, (A, 6))
            st = st.replace(memory=st.memory.replace(seen=jnp.asarray(seen)))
        rec, got = both(jax.random.key(100 + t), st)
        kr = params.feed_size - params.feed_following
        for a in range(A):
            rec_ids = np.asarray(rec.ids[a])
            rec_ok = np.asarray(rec.valid[a])
            fol = _ref_following(st, a, params, set(rec_ids[:kr][rec_ok[:kr]].tolist()))
            want = ([int(i) for i, v in zip(rec_ids[:kr], rec_ok[:kr]) if v] + fol
                    + [int(i) for i, v in zip(rec_ids[kr:], rec_ok[kr:]) if v and i not in fol])
            want = want[:params.feed_size]
            ids = np.asarray(got.ids[a])
            ok = np.asarray(got.valid[a])
            assert ids[ok].tolist() == want, (t, a, fol)
            assert ok.tolist() == sorted(ok.tolist(), reverse=True)  # valid ones first
            checked += len(fol)
    assert checked >= 10  # the followee part was exercised


TEXTS = ["Hello world!", "Soup again?", "Big news!!! 3 new cafés.", "ok", "Is 8:15 late?",
         "Nice one!", "lol", "100% agree"]


def _ref_thread(posts, post_id, c):
    """The c newest alive comments (with text) of a post, by scanning every slot."""
    p = jax.tree.map(np.asarray, posts)
    live = (p.id >= 0) & (p.id >= int(p.next_id) - p.id.shape[0])
    mine = np.flatnonzero(live & (p.kind == PostKind.COMMENT) & (p.parent == post_id))
    mine = mine[np.argsort(-p.id[mine])][:c]
    return [int(p.id[s]) if (p.tokens[s] >= 0).any() else -1 for s in mine]


@pytest.mark.parametrize("c", [1, 3])
def test_feed_comments_thread_and_prompt_equal_brute_force(c):
    tok = tiny_tokenizer()
    L, K, N = 24, 3, 40
    params = society.make_params(num_users=N, num_agents=2, post_capacity=60, content_len=L,
                                 num_seed_posts=0, feed_size=K, pool_size=8, embed_dim=8,
                                 crowd=False, crowd_budget=16, feed_comments=c)
    enc = [tok.encode(" " + t, add_special_tokens=False) for t in TEXTS]
    content = np.full((len(TEXTS), L), PAD_TOKEN, np.int32)
    for i, r in enumerate(enc):
        content[i, :len(r)] = r
    rng = np.random.default_rng(0)
    st = society.reset(jax.random.key(0), params)
    apply = jax.jit(lambda s, b: society.step(jax.random.key(0), s, b, params)[0])
    for _ in range(14):  # posts, then comments (several per post per batch), wrapping the ring
        n = int(st.posts.next_id)
        live = [i for i in range(max(0, n - 60), n)
                if int(st.posts.kind[i % 60]) == PostKind.POST]
        b = 10
        types = [T.CREATE_POST if (not live or rng.random() < 0.3) else T.CREATE_COMMENT
                 for _ in range(b)]
        targets = [int(rng.choice(live[-6:])) if ty == T.CREATE_COMMENT else -1
                   for ty in types]
        rows = rng.integers(0, len(TEXTS), b)
        cont = np.where(rng.random((b, 1)) < 0.15, PAD_TOKEN, content[rows])  # some text-less
        st = apply(st, make_actions(params, types, rng.integers(2, N, b), targets, cont,
                                    rng.normal(size=(b, 8))))
    n = int(st.posts.next_id)
    posts = [i for i in range(n - 60, n) if int(st.posts.kind[i % 60]) == PostKind.POST]
    posts.sort(key=lambda i: -int(st.posts.comments[i % 60]))  # the most-commented first
    feed_ids = np.asarray([posts[:3], posts[3:6]], np.int32)
    feed_ids[1, 1] = -1  # an empty slot
    valid = feed_ids >= 0
    slots = jnp.asarray(np.where(valid, feed_ids % 60, 0))
    view = prompting.feed_view(st.posts, slots, jnp.asarray(valid), c)
    cids = np.asarray(view.comment_ids)
    has_any = 0
    for b in range(2):
        for k in range(K):
            if not valid[b, k]:
                assert (cids[b, k] == -1).all()
                continue
            want = _ref_thread(st.posts, int(feed_ids[b, k]), c)
            want += [-1] * (c - len(want))
            assert cids[b, k].tolist() == want, (b, k)
            has_any += sum(w >= 0 for w in want)
    assert has_any >= 2 * c
    # The prompt shows exactly those comments with their labels (token for token).
    template = prompting.PromptTemplate.build(tok, ["You are Ada, an engineer.",
                                                    "You are Bo, a cook."], "Feed:", "Act:", K,
                                              L, bucket=32, feed_comments=c, num_users=N)
    ids, mask = prompting.assemble(template, jnp.asarray([0, 1]), view)
    p = jax.tree.map(np.asarray, st.posts)

    def text(i):
        return tok.decode([int(x) for x in p.tokens[i % 60] if x >= 0])

    def name(u):
        return ["Ada", "Bo"][u] if u < 2 else prompting.crowd_name(u)

    for b in range(2):
        shown = []
        for k in range(K):
            if not valid[b, k]:
                shown.append(None)
                continue
            s = int(feed_ids[b, k]) % 60
            thread = tuple(prompting.FeedComment(name(int(p.author[i % 60])), text(i),
                                                 int(p.likes[i % 60])) if i >= 0 else None
                           for i in cids[b, k])
            shown.append(prompting.FeedPost(name(int(p.author[s])), text(s), int(p.likes[s]),
                                            int(p.comments[s]), thread=thread))
        msg = prompting.render_user_message("Feed:", shown, "Act:", feed_comments=c)
        persona = ["You are Ada, an engineer.", "You are Bo, a cook."][b]
        want = tok.apply_chat_template([{"role": "system", "content": persona},
                                        {"role": "user", "content": msg}], tokenize=False,
                                       add_generation_prompt=True)
        got = np.asarray(ids[b])[np.asarray(mask[b])].tolist()
        assert got == tok(want, add_special_tokens=False)["input_ids"]
        if b == 0:
            assert f"\n  comment [{K + 1}] by " in msg
