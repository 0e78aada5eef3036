"""Cascades (`social.cascades`) against a brute-force Python walk of the same parent links, on
random forests in a ring buffer that has evicted its oldest posts."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.social import cascades as cascades_lib
from jaxsocial.social.state import EMPTY, PostKind, Posts


def make_posts(n_created: int, capacity: int, seed: int):
    """A ring of `capacity` slots after `n_created` creations: each post is an original, a
    comment, a repost or a quote of an earlier post (reposts of reposts are redirected to the
    original, as the society does), created at non-decreasing ticks."""
    rng = np.random.default_rng(seed)
    kind, parent, created = [], [], []
    tick = 0
    for i in range(n_created):
        tick += int(rng.integers(0, 2))
        k = PostKind.POST if i == 0 else PostKind(int(rng.choice(4, p=[.3, .15, .3, .25])))
        par = EMPTY
        if k != PostKind.POST:
            # mostly recent targets, so the tail of the ring holds long chains
            par = int(max(0, i - 1 - rng.geometric(0.15)))
            if k == PostKind.REPOST and kind[par] == PostKind.REPOST:
                par = parent[par]
        kind.append(int(k))
        parent.append(par)
        created.append(tick)
    ids = np.full(capacity, EMPTY, np.int32)
    cols = {name: np.full(capacity, EMPTY if name == "parent" else 0, np.int32)
            for name in ("kind", "parent", "created_at")}
    for i in range(max(0, n_created - capacity), n_created):
        s = i % capacity
        ids[s], cols["kind"][s], cols["parent"][s], cols["created_at"][s] = (
            i, kind[i], parent[i], created[i])
    z = jnp.zeros(capacity, jnp.int32)
    posts = Posts(id=jnp.asarray(ids), kind=jnp.asarray(cols["kind"]), author=z,
                  parent=jnp.asarray(cols["parent"]), created_at=jnp.asarray(cols["created_at"]),
                  tokens=jnp.zeros((capacity, 1), jnp.int32),
                  embedding=jnp.zeros((capacity, 1), jnp.float32), likes=z, dislikes=z,
                  reposts=z, quotes=z, comments=z, reports=z, likes_h=z,
                  last_comment=z - 1, prev_comment=z - 1, prev_by_author=z - 1,
                  next_id=jnp.int32(n_created))
    return posts, dict(kind=kind, parent=parent, created=created, first=max(0, n_created
                                                                            - capacity))


def walk(ref, n_created):
    """{root id: [(depth, member id), ...]} by walking every live share up its chain."""
    kind, parent, first = ref["kind"], ref["parent"], ref["first"]
    alive = lambda i: first <= i < n_created  # noqa: E731
    trees = {i: [] for i in range(first, n_created) if kind[i] == PostKind.POST}
    for i in range(first, n_created):
        if kind[i] not in (PostKind.REPOST, PostKind.QUOTE):
            continue
        node, d = i, 0
        while kind[node] in (PostKind.REPOST, PostKind.QUOTE):
            node, d = parent[node], d + 1
            if not alive(node) or kind[node] == PostKind.COMMENT:
                node = None
                break
        if node is not None:
            trees[node].append((d, i))
    return trees


def brute_force(ref, n_created):
    """{root id: (size, depth, breadth, half_time)} from `walk`."""
    created = ref["created"]
    trees = walk(ref, n_created)
    out = {}
    for root, members in trees.items():
        if not members:
            out[root] = (0, 0, 0, -1)
            continue
        levels = {}
        for d, _ in members:
            levels[d] = levels.get(d, 0) + 1
        order = sorted(i for _, i in members)
        half = created[order[math.ceil(len(order) / 2) - 1]] - created[root]
        out[root] = (len(members), max(levels), max(levels.values()), half)
    return out


@pytest.mark.parametrize("n_created, capacity, seed", [(40, 64, 0), (300, 128, 1),
                                                         (1000, 257, 2)])
def test_cascades_equal_a_brute_force_walk(n_created, capacity, seed):
    posts, ref = make_posts(n_created, capacity, seed)
    got = jax.jit(cascades_lib.cascades)(posts)
    want = brute_force(ref, n_created)
    ids = np.asarray(posts.id)
    roots = {int(ids[s]): s for s in np.flatnonzero(np.asarray(got.is_root))}
    assert set(roots) == set(want)
    table = {i: (int(got.size[s]), int(got.depth[s]), int(got.breadth[s]),
                 int(got.half_time[s])) for i, s in roots.items()}
    assert table == want
    # the case is not trivial: some trees are deep and wide, and the ring has evicted posts
    assert max(v[1] for v in want.values()) >= 2 and max(v[2] for v in want.values()) >= 2
    assert n_created <= capacity or ref["first"] > 0


def test_roots_and_the_largest_trees_equal_the_walk():
    """`root` names each live share's root; `trees` lists the largest cascades (ties: the older
    root), each root first and then its members in creation order, parents before children."""
    posts, ref = make_posts(1000, 257, 2)
    c = jax.jit(cascades_lib.cascades)(posts)
    want = walk(ref, 1000)
    ids, root = np.asarray(posts.id), np.asarray(c.root)
    got = {}
    for s in np.flatnonzero(root >= 0):
        got.setdefault(int(ids[root[s]]), []).append(int(ids[s]))
    got = {r: sorted(m) for r, m in got.items()}
    assert got == {r: sorted(i for _, i in m) for r, m in want.items() if m}
    largest = sorted(want, key=lambda r: (-len(want[r]), r))[:3]
    trees = cascades_lib.trees(c, posts, n=3)
    assert [ids[t["root"]] for t in trees] == largest
    for t, r in zip(trees, largest):
        nodes = [n["id"] for n in t["nodes"]]
        assert nodes == [r] + sorted(i for _, i in want[r]) and t["size"] == len(want[r])
        assert t["nodes"][0]["parent"] == -1 and t["nodes"][0]["kind"] == "post"
        assert all(n["parent"] in nodes[:k] for k, n in enumerate(t["nodes"]) if k)
    cut = cascades_lib.trees(c, posts, n=1, max_nodes=3)[0]["nodes"]
    assert [n["id"] for n in cut] == [largest[0]] + sorted(i for _, i in want[largest[0]])[:2]


def test_a_broken_parent_link_is_caught():
    """Negative control: re-pointing one deep member at another root changes the table."""
    posts, ref = make_posts(300, 128, 1)
    got = cascades_lib.cascades(posts)
    deep = int(np.argmax(np.asarray(got.depth)))  # a root with a deep tree
    kinds, parents = np.asarray(posts.kind), np.asarray(posts.parent)
    ids = np.asarray(posts.id)
    member = [s for s in range(128) if kinds[s] in (PostKind.REPOST, PostKind.QUOTE)
              and parents[s] == ids[deep]]
    other = [s for s in np.flatnonzero(np.asarray(got.is_root)) if s != deep][0]
    bad = posts.replace(parent=posts.parent.at[member[0]].set(int(ids[other])))
    again = cascades_lib.cascades(bad)
    assert int(again.size[deep]) < int(got.size[deep])
    assert int(again.size[other]) > int(got.size[other])


def test_summary_is_numpys_percentiles_over_the_roots():
    posts, _ = make_posts(300, 128, 1)
    c = cascades_lib.cascades(posts)
    got = cascades_lib.summary(c)
    roots = np.asarray(c.is_root)
    size = np.asarray(c.size)[roots]
    assert got["roots"] == roots.sum() and got["spread_share"] == (size > 0).mean()
    assert got["size"]["p90"] == np.percentile(size, 90) and got["size"]["max"] == size.max()
    spread = np.asarray(c.half_time)[roots][size > 0]
    assert len(spread) and got["half_time"]["p50"] == np.percentile(spread, 50)
    # no roots (a ring of comments only): the count alone
    empty = cascades_lib.Cascades(*(jnp.zeros(4, t) for t in (bool, jnp.int32, jnp.int32,
                                                               jnp.int32, jnp.int32, jnp.int32)))
    assert cascades_lib.summary(empty) == {"roots": 0}
