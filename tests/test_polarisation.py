"""Polarisation of the follow graph (`social.polarisation`) against NumPy references, with
planted camps as the positive case and a shuffled graph as the negative control."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxsocial.social import polarisation as pol
from jaxsocial.social.state import Graph, Users

N, F, D = 60, 5, 8


def society(camps: bool, seed: int = 0):
    """Users in two interest camps; with `camps`, each follows mostly its own camp."""
    rng = np.random.default_rng(seed)
    side = np.arange(N) % 2 == 0
    centre = rng.normal(size=(2, D))
    interest = centre[side.astype(int)] + 0.3 * rng.normal(size=(N, D))
    interest /= np.linalg.norm(interest, axis=1, keepdims=True)
    following = np.full((N, F), -1, np.int32)
    for u in range(N):
        k = int(rng.integers(1, F + 1))  # holes at the row's end, some rows full
        same = np.flatnonzero((side == side[u]) & (np.arange(N) != u))
        pool = same if camps else np.setdiff1d(np.arange(N), [u])
        following[u, :k] = rng.choice(pool, size=k, replace=False)
    z = jnp.zeros(N, jnp.int32)
    users = Users(persona=z, interest=jnp.asarray(interest, jnp.float32),
                  activity=jnp.zeros(N), num_followers=z, num_following=z, last_post=z,
                  profile_sum=jnp.zeros((N, D)), profile_count=z)
    return users, Graph(following=jnp.asarray(following), muted=jnp.full((N, 1), -1)), side


def np_homophily(interest, following):
    cos = [interest[u] @ interest[v] for u in range(N) for v in following[u] if v >= 0]
    return float(np.mean(cos))


def np_modularity(following, side):
    e = [(u, v) for u in range(N) for v in following[u] if v >= 0]
    m = len(e)
    q = 0.0
    for c in (False, True):
        inside = sum(side[u] == c and side[v] == c for u, v in e)
        out_c = sum(side[u] == c for u, _ in e)
        in_c = sum(side[v] == c for _, v in e)
        q += inside / m - (out_c / m) * (in_c / m)
    return q


def test_homophily_and_modularity_equal_numpy():
    users, graph, side = society(camps=True)
    interest, following = np.asarray(users.interest), np.asarray(graph.following)
    assert np.isclose(float(jax.jit(pol.homophily)(users, graph)),
                      np_homophily(interest, following), atol=1e-5)
    got_side = np.asarray(jax.jit(pol.interest_split)(users))
    assert (got_side == side).all() or (got_side == ~side).all()  # the planted camps
    assert np.isclose(float(pol.modularity(graph, jnp.asarray(got_side))),
                      np_modularity(following, got_side), atol=1e-6)


def test_shuffle_keeps_degrees_and_removes_homophily():
    users, graph, _ = society(camps=True)
    shuffled = jax.jit(pol.shuffled_followees)(jax.random.key(3), graph)
    a, b = np.asarray(graph.following), np.asarray(shuffled.following)
    assert ((a >= 0) == (b >= 0)).all()  # every user keeps its out-degree
    assert (np.bincount(a[a >= 0], minlength=N) == np.bincount(b[b >= 0], minlength=N)).all()
    assert not (a == b).all()
    h, h0 = float(pol.homophily(users, graph)), float(pol.homophily(users, shuffled))
    assert h > h0 + 0.3  # camps follow their own: far above the shuffle
    other = pol.shuffled_followees(jax.random.key(4), graph)
    assert not (np.asarray(other.following) == b).all()  # the key decides the shuffle


def test_shuffled_homophily_is_the_mean_over_shuffles():
    """The closed form equals NumPy's (mean follower interest) . (mean followee interest) over
    the edges, and the mean homophily of many drawn shuffles; the graph's own homophily (the
    camps) is not it (negative control)."""
    users, graph, _ = society(camps=True)
    interest, following = np.asarray(users.interest), np.asarray(graph.following)
    src, dst = np.nonzero(following >= 0)[0], following[following >= 0]
    expected = interest[src].mean(0) @ interest[dst].mean(0)
    got = float(jax.jit(pol.homophily_shuffled)(users, graph))
    assert np.isclose(got, expected, atol=1e-5)
    draws = jax.vmap(lambda k: pol.homophily(users, pol.shuffled_followees(k, graph)))(
        jax.random.split(jax.random.key(5), 200))
    assert abs(float(jnp.mean(draws)) - got) < 4 * float(jnp.std(draws)) / np.sqrt(200) + 1e-4
    assert float(pol.homophily(users, graph)) > got + 0.3


def test_planted_camps_against_a_graph_that_ignores_interests():
    (u1, g1, _), (u0, g0, _) = society(camps=True), society(camps=False)
    side1, side0 = pol.interest_split(u1), pol.interest_split(u0)
    assert float(pol.modularity(g1, side1)) > 0.4 and abs(float(pol.modularity(g0, side0))) < 0.1
    key = jax.random.key(0)
    assert float(pol.homophily(u1, g1)) > float(
        pol.homophily(u1, pol.shuffled_followees(key, g1))) + 0.3
    assert abs(float(pol.homophily(u0, g0)) - float(
        pol.homophily(u0, pol.shuffled_followees(key, g0)))) < 0.15
    assert 0.4 <= float(jnp.mean(side1)) <= 0.6


def test_feed_diversity_equals_numpy_and_is_zero_for_a_feed_of_one_post():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(4, 5, D))
    emb /= np.linalg.norm(emb, axis=-1, keepdims=True)
    valid = np.array([[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0], [0, 1, 0, 1, 1]], bool)
    got = np.asarray(pol.feed_diversity(jnp.asarray(emb, jnp.float32), jnp.asarray(valid)))
    for b in range(4):
        e = emb[b][valid[b]]
        pairs = [1 - e[i] @ e[j] for i in range(len(e)) for j in range(len(e)) if i != j]
        assert (np.isnan(got[b]) if not pairs else np.isclose(got[b], np.mean(pairs), atol=1e-6))
    same = np.repeat(emb[:, :1], 5, axis=1)  # negative control: one post shown five times
    assert np.allclose(pol.feed_diversity(jnp.asarray(same, jnp.float32),
                                          jnp.ones((4, 5), bool)), 0.0, atol=1e-6)


def test_summary_of_a_reset_society():
    from jaxsocial.social import recsys
    from jaxsocial.social import society as society_lib
    params = society_lib.make_params(num_users=64, num_personas=2, embed_dim=D,
                                     post_capacity=128, num_seed_posts=48, feed_size=4,
                                     pool_size=32, max_active=16, crowd_budget=16)
    state = society_lib.reset(jax.random.key(0), params)
    got = jax.jit(pol.summary, static_argnames="sample")(jax.random.key(1), state, params,
                                                          sample=16)
    assert int(got["follow_edges"]) == int((np.asarray(state.graph.following) >= 0).sum())
    assert np.isclose(float(got["homophily"]), float(pol.homophily(state.users, state.graph)))
    # exposure diversity: the same keys and users through recsys.recommend and NumPy
    _, k_users, k_feed = jax.random.split(jax.random.key(1), 3)
    who = jax.random.permutation(k_users, 64)[:16].astype(jnp.int32)
    feed = recsys.recommend(k_feed, state, who, params)
    emb, valid = np.asarray(state.posts.embedding)[np.asarray(feed.slots)], np.asarray(feed.valid)
    per = [np.mean([1 - emb[b, i] @ emb[b, j] for i in range(4) for j in range(4)
                    if i != j and valid[b, i] and valid[b, j]])
           for b in range(16) if valid[b].sum() >= 2]
    assert per and np.isclose(float(got["exposure_diversity"]), np.mean(per), atol=1e-5)
