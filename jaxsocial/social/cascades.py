"""Information cascades: how far each original post spread through reposts and quotes.

A post's cascade is its tree of reposts and quotes: a repost or quote points at the post it
shares (`Posts.parent`; a repost of a repost is redirected to the original when it is made, a
quote of a quote keeps the quote as its parent), comments are not part of it. For every slot
of the ring buffer that holds an original post (`PostKind.POST`), `cascades` computes on
device, from the parent links alone:

- `size`: the reposts and quotes in its tree (the root not counted);
- `depth`: the longest parent chain down from the root (0 = nobody shared it);
- `breadth`: the most nodes at any one depth below the root (0 when size is 0);
- `half_time`: ticks from the root's creation until its tree held half of its final size
  (the creation tick of the ceil(size / 2)-th member, in creation order), -1 when size is 0;
- `root`: for every share in a live cascade, its root's slot (`trees` draws the largest ones).

A member whose chain reaches an evicted post belongs to no live cascade (ids grow and the ring
evicts oldest first, so its root was evicted too). Pointer doubling finds every node's root and
depth in ceil(log2 P) steps; sizes, depths, breadths and half times are segment reductions over
roots, so the whole computation is jit-able at static shapes [P].
"""

from __future__ import annotations

import chex
import flax.struct
import jax
import jax.numpy as jnp

from jaxsocial.social.state import PostKind, Posts

Array = jax.Array


@flax.struct.dataclass
class Cascades:
    """Per ring slot [P] int32; meaningful where `is_root` (an alive original post)."""

    is_root: Array   # [P] bool
    size: Array      # [P] int32
    depth: Array     # [P] int32
    breadth: Array   # [P] int32
    half_time: Array  # [P] int32, -1 where size == 0
    root: Array      # [P] int32 the slot of a share's root, -1 off the live cascades


def cascades(posts: Posts) -> Cascades:
    """The cascade of every alive original post in `posts` (see the module docstring)."""
    p = posts.capacity
    chex.assert_shape([posts.id, posts.kind, posts.parent, posts.created_at], (p,))
    slots = jnp.arange(p, dtype=jnp.int32)
    alive = posts.id >= 0
    is_root = alive & (posts.kind == PostKind.POST)
    shares = alive & ((posts.kind == PostKind.REPOST) | (posts.kind == PostKind.QUOTE))
    parent_ok = shares & posts.alive(posts.parent)
    # anc: the next slot up (self at a root or a dead end); hops: edges to it; ok: the chain
    # so far stays among live shares and ends at a live original.
    anc = jnp.where(parent_ok, posts.slot(posts.parent), slots)
    hops = parent_ok.astype(jnp.int32)
    ok = is_root | parent_ok
    for _ in range(max(1, (p - 1).bit_length())):
        ok = ok & ok[anc]
        hops = hops + hops[anc]
        anc = anc[anc]
    member = shares & ok & is_root[anc]
    root = jnp.where(member, anc, p)  # p: a dropped segment
    ones = member.astype(jnp.int32)
    size = jax.ops.segment_sum(ones, root, num_segments=p + 1)[:p]
    depth = jnp.maximum(jax.ops.segment_max(jnp.where(member, hops, 0), root,
                                            num_segments=p + 1)[:p], 0)
    # Breadth: the longest run of one (root, depth) pair among members sorted by it.
    level = jnp.where(member, hops, 0)
    order = jnp.lexsort((level, root))
    s_root, s_level = root[order], level[order]
    start = jnp.concatenate([jnp.ones((1,), bool), (s_root[1:] != s_root[:-1])
                             | (s_level[1:] != s_level[:-1])])
    run_id = jnp.cumsum(start) - 1
    run_len = jax.ops.segment_sum(jnp.ones((p,), jnp.int32), run_id, num_segments=p)
    breadth = jnp.maximum(jax.ops.segment_max(run_len[run_id], s_root,
                                              num_segments=p + 1)[:p], 0)
    # Half time: a root's members in creation order (ids grow with creation); the
    # ceil(size / 2)-th one's creation tick minus the root's.
    by_time = jnp.lexsort((posts.id, root))
    t_root = root[by_time]
    first = jax.ops.segment_min(slots, t_root, num_segments=p + 1)
    rank = slots - first[t_root]
    need = (size[jnp.minimum(t_root, p - 1)] + 1) // 2 - 1
    hit = (t_root < p) & (rank == need)
    when = jnp.where(hit, posts.created_at[by_time], -1)
    at_half = jax.ops.segment_max(when, t_root, num_segments=p + 1)[:p]
    half_time = jnp.where(size > 0, at_half - posts.created_at, -1)
    zero = jnp.zeros((p,), jnp.int32)
    return Cascades(is_root=is_root, size=jnp.where(is_root, size, zero),
                    depth=jnp.where(is_root, depth, zero),
                    breadth=jnp.where(is_root, breadth, zero),
                    half_time=jnp.where(is_root, half_time, -1).astype(jnp.int32),
                    root=jnp.where(member, anc, -1).astype(jnp.int32))


PERCENTILES = (50, 90, 99)


def summary(c: Cascades) -> dict:
    """Host-side distribution of `c` over the alive original posts: their count ("roots"),
    the share with any reposts or quotes ("spread_share"), the histogram of sizes
    ("size_hist": roots of size 0, 1, 2, ...; the CCDF's source), and for size, depth and breadth
    their mean, p50 / p90 / p99 and max; half_time over the cascades that spread (size > 0).
    Percentiles are numpy's (linear interpolation)."""
    import numpy as np

    roots = np.asarray(c.is_root)
    out = {"roots": int(roots.sum())}
    if not out["roots"]:
        return out
    size = np.asarray(c.size)[roots]
    out["spread_share"] = float((size > 0).mean())
    out["size_hist"] = np.bincount(size).tolist()  # roots with size 0, 1, 2, ...
    for name, values in (("size", size), ("depth", np.asarray(c.depth)[roots]),
                         ("breadth", np.asarray(c.breadth)[roots]),
                         ("half_time", np.asarray(c.half_time)[roots][size > 0])):
        if not len(values):
            continue
        row = {"mean": float(values.mean()), "max": int(values.max())}
        row.update({f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES})
        out[name] = row
    return out


def trees(c: Cascades, posts: Posts, n: int = 3, max_nodes: int = 200) -> list:
    """Host side: the `n` largest cascades that spread (size > 0; ties: the older root first),
    each {"root": slot, "size": its size, "nodes": [{"id", "parent", "author", "kind",
    "created_at"}, ...]}: the root first (parent -1), then its reposts and quotes in creation
    order, at most `max_nodes` nodes (the earliest; a node's parent is always among the
    earlier ones)."""
    import numpy as np

    size, is_root, root = (np.asarray(x) for x in (c.size, c.is_root, c.root))
    ids, kind, author, parent, created = (np.asarray(x) for x in (
        posts.id, posts.kind, posts.author, posts.parent, posts.created_at))
    spread = np.flatnonzero(is_root & (size > 0))
    order = spread[np.lexsort((ids[spread], -size[spread]))][:n]
    out = []
    for r in order:
        members = np.flatnonzero(root == r)
        members = members[np.argsort(ids[members], kind="stable")][:max_nodes - 1]
        nodes = [{"id": int(ids[s]), "parent": -1 if s == r else int(parent[s]),
                  "author": int(author[s]), "kind": PostKind(int(kind[s])).name.lower(),
                  "created_at": int(created[s])} for s in (int(r), *members.tolist())]
        out.append({"root": int(r), "size": int(size[r]), "nodes": nodes})
    return out
