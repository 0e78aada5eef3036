"""society.reset / step: jit, vmap, determinism, conservation laws, horizon likes, metrics."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.rl import rewards
from jaxsocial.social import metrics, society
from jaxsocial.social.actions import ActionType as T
from jaxsocial.social.actions import Reason, empty_actions, make_actions
from jaxsocial.social.state import PostKind, ReactionKind

A = 4  # LLM agents
PARAMS = society.make_params(
    num_users=200, num_agents=A, post_capacity=192, num_seed_posts=128, embed_dim=8,
    content_len=4, max_following=12, init_following=4, reaction_memory=48, seen_memory=20,
    feed_size=6, pool_size=32, in_network=4, max_active=64, crowd_budget=192,
    reward_horizon=3, activation_rate=0.2, like_bias=-2.0, p_post=0.2)
TICKS = 8


def _agent_batch(tick, prev):
    """Agents 0..3 post, like agent 0's previous post, follow someone, and send one malformed
    action."""
    return make_actions(
        PARAMS, [T.CREATE_POST, T.LIKE_POST, T.FOLLOW, T.MALFORMED],
        [0, 1, 2, 3], [-1, prev, 10 + tick, -1],
        content=np.full((4, 4), tick + 1), embedding=np.ones((4, 8)))


@pytest.fixture(scope="module")
def step():
    return jax.jit(functools.partial(society.step, params=PARAMS))


@pytest.fixture(scope="module")
def run(step):
    """TICKS ticks with agent actions; returns states and infos per tick."""
    state = society.reset(jax.random.key(0), PARAMS)
    states, infos, prev = [state], [], 0
    for t in range(TICKS):
        state, info = step(jax.random.key(100 + t), state, _agent_batch(t, prev))
        prev = int(info.agent.created_id[0])
        states.append(state)
        infos.append(info)
    return states, infos


def test_reset_population(run):
    s = jax.device_get(run[0][0])
    g = s.graph.following
    assert (g < PARAMS.num_users).all()
    for u in range(PARAMS.num_users):
        row = g[u][g[u] >= 0]
        assert len(set(row)) == len(row) and u not in row
    np.testing.assert_array_equal(s.users.num_followers, np.bincount(g[g >= 0], minlength=200))
    # heavy-tailed in-degree and activity
    assert s.users.num_followers.max() > 5 * s.users.num_followers.mean()
    act = np.sort(s.users.activity)[::-1]
    assert act[:20].sum() > 0.3 * act.sum()
    assert abs(act.mean() - PARAMS.activation_rate) < 0.5 * PARAMS.activation_rate
    np.testing.assert_allclose(np.linalg.norm(s.users.interest, axis=1), 1.0, rtol=1e-5)
    assert int(s.posts.next_id) == 128 and (s.posts.created_at[:128] < 0).all()


def test_same_key_same_trajectory_and_vmap(step, run):
    states, _ = run
    again = society.reset(jax.random.key(0), PARAMS)
    prev = 0
    for t in range(2):
        again, info = step(jax.random.key(100 + t), again, _agent_batch(t, prev))
        prev = int(info.agent.created_id[0])
    jax.tree.map(np.testing.assert_array_equal, again, states[2])
    other, _ = step(jax.random.key(7), states[1], _agent_batch(1, 128))
    assert not np.array_equal(np.asarray(other.posts.likes), np.asarray(states[2].posts.likes))

    # vmap over 3 independent societies (different seeds) == running each alone
    keys = jax.random.split(jax.random.key(5), 3)
    singles = [society.reset(k, PARAMS) for k in keys]
    batched = jax.tree.map(lambda *x: jnp.stack(x), *singles)
    acts = jax.tree.map(lambda x: jnp.stack([x] * 3), empty_actions(4, PARAMS))
    vstep = jax.jit(jax.vmap(functools.partial(society.step, params=PARAMS)))
    skeys = jax.random.split(jax.random.key(6), 3)
    out, info = vstep(skeys, batched, acts)
    for i in range(3):
        alone, alone_info = step(skeys[i], singles[i], empty_actions(4, PARAMS))
        mine = jax.tree.map(lambda x: x[i], out)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                     mine, alone)
        np.testing.assert_array_equal(info.like_delta[i], alone_info.like_delta)
    assert not np.array_equal(np.asarray(out.posts.likes[0]), np.asarray(out.posts.likes[1]))


def test_crowd_is_active(run):
    _, infos = run
    crowd = [jax.device_get(i.crowd) for i in infos]
    assert all(c.num_active > 10 for c in crowd)
    likes = sum(int(c.apply.type_counts[T.LIKE_POST]) for c in crowd)
    posts = sum(int(c.apply.type_counts[T.CREATE_POST]) for c in crowd)
    assert likes > 50 and posts > 10
    assert sum(int(c.event_overflow) + int(c.active_overflow) for c in crowd) == 0


def test_conservation_laws(run):
    states, infos = run
    for s in states[1:]:
        s = jax.device_get(s)
        g = s.graph.following
        np.testing.assert_array_equal(s.users.num_followers,
                                      np.bincount(g[g >= 0], minlength=200))
        np.testing.assert_array_equal(s.users.num_following, (g >= 0).sum(1))
        alive = {int(i): k for k, i in enumerate(s.posts.id) if i >= 0}
        rec = [(u, int(p), int(k)) for u in range(200)
               for p, k in zip(s.memory.react_post[u], s.memory.react_kind[u]) if int(p) in alive]
        assert len(rec) == len(set(rec))  # nobody likes (dislikes, reposts) a post twice
        likes = np.zeros(192, np.int64)
        dislikes = np.zeros(192, np.int64)
        for u, p, k in rec:
            if k == ReactionKind.LIKE:
                likes[alive[p]] += 1
            elif k == ReactionKind.DISLIKE:
                dislikes[alive[p]] += 1
        # each alive post's counter == number of like records pointing at it
        np.testing.assert_array_equal(s.posts.likes, likes)
        np.testing.assert_array_equal(s.posts.dislikes, dislikes)
    # like_delta accounts for every change of every post that stayed in its slot
    first, last = jax.device_get(states[1]), jax.device_get(states[-1])
    same = (first.posts.id == last.posts.id) & (first.posts.id >= 0)
    total = sum(np.asarray(i.like_delta) for i in infos[1:])
    np.testing.assert_array_equal((last.posts.likes - first.posts.likes)[same], total[same])


def _counters(posts):
    return np.stack([posts.likes, posts.reposts, posts.comments], -1)


def test_step_reports_engagement_followers_and_crowd_posts(run):
    """StepInfo's engagement_delta / follower_delta / crowd_posts against the states."""
    states, infos = run
    states = [jax.device_get(s) for s in states]
    first, last = states[1], states[-1]
    # Posts alive in the same slot throughout: the deltas sum to their counters' change.
    same = (first.posts.id == last.posts.id) & (first.posts.id >= 0)
    total = sum(np.asarray(i.engagement_delta) for i in infos[1:])
    change = _counters(last.posts) - _counters(first.posts)
    np.testing.assert_array_equal(change[same], total[same])
    assert np.abs(change[same]).sum() > 0  # the check compares something
    # A post new in its slot counts from 0: a post created at tick t ends with the sum of
    # its slot's deltas from t on.
    born = {}
    for t in range(1, len(infos)):
        new = states[t + 1].posts.id != states[t].posts.id
        for s in np.nonzero(new)[0]:
            born[s] = t
    checked = 0
    for s, t in born.items():
        if last.posts.id[s] >= 0:
            got = sum(np.asarray(infos[u].engagement_delta[s]) for u in range(t, len(infos)))
            np.testing.assert_array_equal(got, _counters(last.posts)[s])
            checked += 1
    assert checked > 10
    for t, i in enumerate(infos):
        before, after = states[t], states[t + 1]
        np.testing.assert_array_equal(
            i.follower_delta, after.users.num_followers[:A] - before.users.num_followers[:A])
        new = after.posts.id != before.posts.id
        assert int(i.crowd_posts) == int((new & (after.posts.author >= A)).sum())
    assert sum(int(i.crowd_posts) for i in infos) > 0
    # Negative control: the raw counter difference (no reset for new posts) disagrees.
    raw = sum(_counters(states[t + 1].posts) - _counters(states[t].posts)
              for t in range(1, len(infos)))
    s0 = [s for s, t in born.items() if last.posts.id[s] >= 0 and t > 1]
    assert any((raw[s] != _counters(last.posts)[s]).any() for s in s0)


def test_five_channels_add_reports_and_dislikes_and_keep_the_first_three(run):
    """engagement_channels=5: channels 3, 4 are the reports and dislikes each post drew (the
    counters' change), and channels 0-2 equal the 3-channel record of the same run."""
    params = PARAMS.replace(engagement_channels=5, dislike_bias=0.0)
    three = PARAMS.replace(dislike_bias=0.0)
    step5 = jax.jit(functools.partial(society.step, params=params))
    step3 = jax.jit(functools.partial(society.step, params=three))
    s5 = s3 = society.reset(jax.random.key(0), params)
    prev, infos, states = 0, [], [s5]
    for t in range(TICKS):
        acts = make_actions(params, [T.CREATE_POST, T.REPORT_POST, T.DISLIKE_POST, T.MALFORMED],
                            [0, 1, 2, 3], [-1, prev, prev, -1],
                            content=np.full((4, 4), t + 1), embedding=np.ones((4, 8)))
        s5, i5 = step5(jax.random.key(100 + t), s5, acts)
        s3, i3 = step3(jax.random.key(100 + t), s3, acts)
        assert i5.engagement_delta.shape == (params.post_capacity, 5)
        np.testing.assert_array_equal(i5.engagement_delta[:, :3], i3.engagement_delta)
        prev = int(i5.agent.created_id[0])
        infos.append(i5)
        states.append(jax.device_get(s5))
    first, last = states[1], states[-1]
    same = (first.posts.id == last.posts.id) & (first.posts.id >= 0)
    total = sum(np.asarray(i.engagement_delta) for i in infos[1:])
    neg = lambda p: np.stack([p.reports, p.dislikes], -1)  # noqa: E731
    change = neg(last.posts) - neg(first.posts)
    np.testing.assert_array_equal(total[same][:, 3:], change[same])
    assert change[same][:, 0].sum() > 0 and change[same][:, 1].sum() > 0  # both were drawn
    with pytest.raises(ValueError, match="engagement_channels"):
        society.make_params(engagement_channels=4)


def test_agent_actions_in_step_and_horizon_reward(run):
    states, infos = run
    h = PARAMS.reward_horizon
    created = []
    for t, info in enumerate(infos):
        a = jax.device_get(info.agent)
        np.testing.assert_array_equal(a.reason, [Reason.OK, Reason.OK, a.reason[2],
                                                 Reason.MALFORMED])
        assert a.reason[2] in (Reason.OK, Reason.DUPLICATE)
        assert int(a.invalid_counts[Reason.MALFORMED]) == 1
        pid = int(a.created_id[0])
        assert pid == int(states[t].posts.next_id)  # agents act before the crowd
        assert a.created_slot[0] == pid % 192 and a.created_generation[0] == pid // 192
        created.append((t, pid))
    final = states[-1]
    # The training loop's reward: likes within the horizon from the recorded deltas and slot ids
    # (rewards.engagement_within_horizon, as train.epoch calls it)
    loop_likes = rewards.engagement_within_horizon(
        jnp.asarray([pid for _, pid in created], jnp.int32),
        jnp.stack([infos[t].tick for t, _ in created]),
        jnp.stack([i.engagement_delta for i in infos]),
        jnp.stack([s.posts.id for s in states[1:]]), h, first_tick=infos[0].tick)[:, 0]
    for j, (t, pid) in enumerate(created):
        s = pid % 192
        assert int(final.posts.author[s]) == 0
        assert (np.asarray(final.posts.tokens[s]) == t + 1).all()
        # reward from the per-tick deltas == the loop's == likes_h frozen in the state
        from_deltas = sum(int(infos[u].like_delta[s]) for u in range(t, min(t + h, TICKS)))
        assert float(loop_likes[j]) == from_deltas
        assert bool(final.posts.alive(jnp.int32(pid)))
        assert int(final.posts.likes_h[s]) == from_deltas
        is_final = int(final.tick) - int(final.posts.created_at[s]) >= h
        assert is_final == (t + h <= TICKS)
    assert any(int(infos[t].like_delta[pid % 192]) > 0 for t, pid in created)


def test_step_without_crowd_and_empty_batch():
    params = PARAMS.replace(crowd=False)
    state = society.reset(jax.random.key(1), params)
    state2, info = jax.jit(functools.partial(society.step, params=params))(
        jax.random.key(0), state, empty_actions(0, params))
    assert int(state2.tick) == 1
    jax.tree.map(np.testing.assert_array_equal, state2.replace(tick=state.tick), state)
    assert int(info.crowd.num_active) == 0 and int(info.like_delta.sum()) == 0


def _np_gini(x):
    x = np.sort(np.asarray(x, np.float64))
    n = len(x)
    if n == 0 or x.sum() == 0:
        return 0.0
    # mean absolute difference / (2 mean)
    return np.abs(x[:, None] - x[None, :]).sum() / (2 * n * n * x.mean())


def test_gini_matches_numpy():
    rng = np.random.default_rng(0)
    gini = jax.jit(metrics.gini)
    for x in (rng.pareto(1.5, 300), rng.integers(0, 5, 50), np.zeros(10), np.ones(7)):
        m = np.zeros(300, bool)
        m[:len(x)] = True
        padded = np.concatenate([x, rng.random(300 - len(x)) * 50])  # masked-out junk
        got = float(gini(jnp.asarray(padded, jnp.float32), jnp.asarray(m)))
        assert got == pytest.approx(_np_gini(padded[m]), abs=1e-5)
    x = rng.pareto(1.5, 300)
    m = rng.random(300) < 0.4
    assert float(gini(jnp.asarray(x, jnp.float32), jnp.asarray(m))) == pytest.approx(
        _np_gini(x[m]), abs=1e-5)
    assert float(metrics.gini(jnp.asarray(x))) == pytest.approx(_np_gini(x), abs=1e-5)


def test_metrics_match_numpy(run):
    states, infos = run
    s, info = states[-1], infos[-1]
    m = metrics.to_json(jax.jit(functools.partial(metrics.compute, params=PARAMS))(s, info))
    p = jax.device_get(s.posts)
    orig = (p.id >= 0) & np.isin(p.kind, [PostKind.POST, PostKind.QUOTE])
    assert m["alive_posts"] == orig.sum()
    assert m["avg_likes_per_post"] == pytest.approx(p.likes[orig].mean(), rel=1e-5)
    assert m["zero_like_share"] == pytest.approx((p.likes[orig] == 0).mean(), rel=1e-5)
    eng = (p.likes + p.reposts + p.quotes + p.comments)[orig] > 0
    assert m["positive_engagement_share"] == pytest.approx(eng.mean(), rel=1e-5)
    mature = orig & (int(s.tick) - p.created_at >= PARAMS.reward_horizon)
    assert m["mature_avg_likes"] == pytest.approx(p.likes_h[mature].mean(), rel=1e-5)
    assert m["likes_gini"] == pytest.approx(_np_gini(p.likes[orig]), abs=1e-5)
    fol = np.asarray(s.users.num_followers)
    assert m["followers_gini"] == pytest.approx(_np_gini(fol), abs=1e-5)
    assert m["followers_max"] == fol.max()
    counts = np.asarray(info.agent.type_counts) + np.asarray(info.crowd.apply.type_counts)
    assert m["action_counts"]["like_post"] == counts[T.LIKE_POST]
    assert sum(m["action_mix"].values()) == pytest.approx(1.0)
    assert m["posts_created"] == counts[[T.CREATE_POST, T.REPOST, T.QUOTE_POST,
                                         T.CREATE_COMMENT]].sum()
    assert m["agent_invalid"] == {"malformed": 1} and m["agent_invalid_total"] == 1
    assert m["agent_actions"] == 4


def test_float_params_are_traced_and_sweep_under_vmap():
    """The float fields of SocialParams are traced: vmap sweeps the crowd's activation rate
    through reset and step in one program, equal to the runs with concrete values, and a new
    value reuses reset's compiled program (sizes and choices stay static)."""
    rates = [0.02, 0.2, 0.8]

    def run(rate):
        p = PARAMS.replace(activation_rate=rate)
        s = society.reset(jax.random.key(0), p)
        s, info = society.step(jax.random.key(1), s, None, p)
        return s.users.activity, info.crowd.num_active

    activity, active = jax.jit(jax.vmap(run))(jnp.asarray(rates, jnp.float32))
    means = np.asarray(activity).mean(axis=1)
    active = np.asarray(active)
    assert np.all(np.diff(means) > 0) and active[0] < active[1] <= active[2]
    for i, r in enumerate(rates):
        alone = society.reset(jax.random.key(0), PARAMS.replace(activation_rate=r))
        np.testing.assert_allclose(np.asarray(activity[i]), np.asarray(alone.users.activity),
                                   rtol=1e-6)
    society.reset(jax.random.key(0), PARAMS.replace(activation_rate=0.33))
    compiled = society.reset._cache_size()
    society.reset(jax.random.key(0), PARAMS.replace(activation_rate=0.44, like_bias=-1.0))
    assert society.reset._cache_size() == compiled


def test_content_budget_draws_content_for_the_creating_rows_only():
    """With `content_budget` the crowd's created posts get the same kind of content (unit
    embeddings near the author's interest) and every other action is unchanged in kind; a budget
    smaller than the tick's creating rows drops the rest and counts them (negative control)."""
    def crowd_tick(**kw):
        params = PARAMS.replace(**kw) if kw else PARAMS
        s0 = society.reset(jax.random.key(0), params)
        s1, info = jax.jit(functools.partial(society.step, params=params))(
            jax.random.key(7), s0, None)
        return jax.device_get((s0, s1, info.crowd))

    _, s_all, c_all = crowd_tick()
    s0, s1, c = crowd_tick(content_budget=64)
    def created(c):
        return int(sum(c.apply.type_counts[t] for t in (T.CREATE_POST, T.QUOTE_POST,
                                                         T.CREATE_COMMENT)))

    assert created(c) == created(c_all) > 5 and int(c.event_overflow) == 0
    assert int(c.apply.type_counts[T.LIKE_POST]) == int(c_all.apply.type_counts[T.LIKE_POST])
    new = (s1.posts.id != s0.posts.id) & (s1.posts.author >= A) & (
        s1.posts.kind == PostKind.POST)
    emb = s1.posts.embedding[new]
    assert new.sum() > 5 and np.allclose(np.linalg.norm(emb, axis=-1), 1.0, atol=1e-5)
    cos = np.sum(emb * s1.users.interest[s1.posts.author[new]], -1)
    assert cos.mean() > 0.5  # interest + noise, not zeros or another user's
    _, _, small = crowd_tick(content_budget=2)
    assert created(small) == 2 and int(small.event_overflow) == created(c_all) - 2
    with pytest.raises(ValueError, match="content_budget"):
        society.make_params(num_users=200, crowd_budget=16, content_budget=17)
