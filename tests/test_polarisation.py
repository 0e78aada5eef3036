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


def test_planted_camps_against_a_graph_that_ignores_interests():
    camps = pol.summary(jax.random.key(0), *society(camps=True)[:2])
    mixed = pol.summary(jax.random.key(0), *society(camps=False)[:2])
    assert float(camps["modularity"]) > 0.4 and abs(float(mixed["modularity"])) < 0.1
    assert float(camps["homophily"]) > float(camps["homophily_shuffled"]) + 0.3
    assert abs(float(mixed["homophily"]) - float(mixed["homophily_shuffled"])) < 0.15
    assert 0.4 <= float(camps["split_share"]) <= 0.6
    assert int(camps["follow_edges"]) == int((np.asarray(society(True)[1].following) >= 0).sum())
