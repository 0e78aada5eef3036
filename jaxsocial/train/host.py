"""The host side of an epoch: metrics, samples, the society's summary, the code bonus,
interviews and the names of the run's exports (`train.run.Run.export_policy` writes them).
Functions of the set-up (`train.setup`), the run's text banks and the epoch's `EpochView` /
state; nothing here is compiled into the epoch."""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxsocial.agents import prompting, tool_calls
from jaxsocial.generation.generate import generate_from_state
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl import policy as policy_lib
from jaxsocial.social import cascades, polarisation, society
from jaxsocial.social.actions import ActionType
from jaxsocial.train import code_problems, report, sharding
from jaxsocial.train import setup as setup_lib
from jaxsocial.train.epoch import EpochView, Rollout
from jaxsocial.train.setup import RunState, Setup, Text

_cascades = jax.jit(cascades.cascades)
_rows = jax.jit(lambda x, rows: x[rows])
_TREES = 3  # the largest cascades the report draws
_polarisation = jax.jit(polarisation.summary, static_argnames=("params", "sample"))

# engagement [..., E]: the first POSITIVE channels (likes, reposts, comments) are positive
# engagement; reports and dislikes follow where recorded (`config.ENGAGEMENT_REWARDS`)
POSITIVE = 3


@functools.partial(jax.jit, static_argnums=(0, 1, 3))
def _interview_answers(pdef, social_params, template, sampling, params, ref_params, soc, key,
                       agent_slot=None):
    """GenerationOutput of every agent's greedy answer to the prompt `template` over the feed
    it would see in `soc` now (`society.feed`: pure, nothing marked seen). agent_slot [A]
    int32: with cohorts, each agent's adapter (-1: the base)."""
    agents = jnp.arange(social_params.num_agents, dtype=jnp.int32)
    feed = society.feed(key, soc, agents, social_params)
    view = prompting.feed_view(soc.posts, feed.slots, feed.valid,
                               social_params.feed_comments or None)
    ids, mask = prompting.assemble(template, agents, view)
    weights = (policy_lib.policy_weights(pdef, params, ref_params) if agent_slot is None else
               lora_lib.adapt(ref_params, params["policy"], pdef.lora, rows=agent_slot))
    return generate_from_state(pdef.graphdef, weights, ids, mask, key, sampling)


def epoch_metrics(setup: Setup, text: Text, v: EpochView, upd, wall: float, t_roll: float
                  ) -> Dict[str, Any]:
    """The metrics of one epoch (a metrics.jsonl row) from its `EpochView` and the update's
    metrics: the blog's numbers, the action mix, parse failures, timing, the agents' topics and
    text drift, and the most- and least-liked posts. wall / t_roll: the epoch's and the
    rollout's seconds (equal for the one-program epoch)."""
    eng = np.asarray(v.engagement)
    m = {**_action_metrics(setup, v, eng), **_program_metrics(setup, v, upd, wall, t_roll)}
    # Text metrics over the first K posts of the epoch, in tick order (all of them when
    # the epoch has at most train.text_metrics_posts posts).
    idx = np.asarray(v.post_index)
    kept = idx >= 0
    idx = idx[kept]
    m.update(topic_metrics(setup, text, np.asarray(v.post_embedding)[kept]))
    texts = _post_texts(setup, v, kept, idx)
    m.update(_text_metrics(setup, text, v, kept, idx, eng, texts))
    if setup.cohorts is not None:
        m["cohorts"] = cohort_metrics(setup, text, v, upd, kept, idx, texts)
    m["feed"] = feed(setup, v, idx, eng, texts)
    return m


def feed(setup: Setup, v: EpochView, idx: np.ndarray, eng: np.ndarray, texts: List[str]
         ) -> List[Dict[str, Any]]:
    """The epoch's first posts (`texts`, at flat rows `idx` of [T, B]) as the report's feed:
    tick, author, the author's persona (and cohort), text, and the likes, reposts and comments
    each drew within the reward horizon. The runner writes it to feed.jsonl, not
    metrics.jsonl."""
    b = np.asarray(v.agent).shape[1]
    authors = np.asarray(v.agent).reshape(-1)[idx]
    counts = eng.reshape(-1, eng.shape[-1])[idx]
    cohort_of = (np.asarray(setup.cohorts.agent_cohort) if setup.cohorts is not None else None)
    rows = []
    for i, t in enumerate(texts):
        a = int(authors[i])
        row = {"tick": int(idx[i]) // b, "agent": a, "persona": setup.personas[a], "text": t,
               "likes": int(counts[i, 0]), "reposts": int(counts[i, 1]),
               "comments": int(counts[i, 2])}
        if cohort_of is not None:
            row["cohort"] = setup.cohorts.names[int(cohort_of[a])]
        rows.append(row)
    return rows


def _action_metrics(setup: Setup, v: EpochView, eng: np.ndarray) -> Dict[str, Any]:
    """The blog's numbers (likes per post, zero-like and positive-engagement shares, posts),
    the actions taken, applied, failed to parse or invalid, the reward and the likes'
    histogram."""
    created = np.asarray(v.created)
    types = np.asarray(v.action_type)
    is_post = created & np.isin(types, [int(ActionType.CREATE_POST),
                                        int(ActionType.QUOTE_POST)])
    likes = eng[..., 0][is_post]
    engaged = eng[..., :POSITIVE].sum(-1)[is_post] > 0
    n_posts = int(is_post.sum())
    names = {int(t): t.name.lower() for t in ActionType}
    mix = {names[k]: int((types == k).sum()) for k in np.unique(types)}
    sc = np.asarray(v.score)
    reason, parsed = np.asarray(v.reason), np.asarray(v.parsed)
    return {
        "avg_likes_per_post": float(likes.mean()) if n_posts else 0.0,
        "zero_like_share": float((likes == 0).mean()) if n_posts else 0.0,
        "positive_engagement_share": float(engaged.mean()) if n_posts else 0.0,
        "total_posts": n_posts,
        # OASIS's unit: one agent action per acting agent and tick (the blog: ~30k/stage)
        "interactions": int(types.size),
        "interactions_applied": int(((reason == 0) & parsed
                                     & (types != int(ActionType.DO_NOTHING))).sum()),
        "created_total": int(created.sum()),
        "parse_failures": int((~parsed).sum()),
        # tool_call mode: no JSON / unknown action / bad argument
        **({"parse_failures_by_kind": {k: int((np.asarray(v.failure) == i).sum()) for i, k
                                       in enumerate(tool_calls.FAILURE_KINDS) if i}}
           if setup.tool_call else {}),
        "invalid_actions": int(((reason != 0) & parsed).sum()),
        "reward_mean": float(sc.mean()),
        "reward_std": float(sc.std()),
        # the reward's distribution over the epoch's trajectories, for the report's box plot
        "reward_box": dict(zip(("min", "q1", "median", "q3", "max"),
                               np.percentile(sc, [0, 25, 50, 75, 100]).astype(float).tolist())),
        "action_mix": mix,
        "crowd_posts": int(v.crowd_posts),
        "likes_hist": np.bincount(likes.astype(int), minlength=1).tolist() if n_posts else [],
        **negative_engagement(eng, is_post),
    }


def _program_metrics(setup: Setup, v: EpochView, upd, wall: float, t_roll: float
                     ) -> Dict[str, Any]:
    """How the epoch's programs ran: where the old log-probs and values came from, timing
    and throughput, and the update's metrics."""
    return {
        # rl.old_logprobs: "rollout" = the rollout's log-probs were the old log-probs
        # (nothing re-scored); "rescore" = re-scored, logprob_gap = max |rollout - rescored|
        "old_logprobs": setup.old_logprobs,
        **({"logprob_gap": float(v.logprob_gap)} if setup.old_logprobs == "rescore" else {}),
        # rl.old_values="rollout": the old values came from the rollout's hidden states
        **({"old_values": "rollout"} if setup.old_values == "rollout" else {}),
        # fused_epoch: one program, so rollout_s / tokens_per_s / ticks_per_s cover the
        # whole epoch (rollout, scoring and update)
        "fused_epoch": bool(setup.fused),
        "tokens_per_s": float(v.tokens) / max(t_roll, 1e-9),
        "ticks_per_s": np.asarray(v.action_type).shape[0] / max(t_roll, 1e-9),
        "rollout_s": t_roll,
        "wall_s": wall,
        # with cohorts: the trainable cohorts' mean (each cohort's own under "cohorts")
        "ppo": {k: float(np.mean(x)) for k, x in upd.items()},
    }


def cohort_metrics(setup: Setup, text: Text, v: EpochView, upd, kept, idx, texts
                   ) -> Dict[str, Any]:
    """Per cohort (agents.cohorts): the blog's four numbers, total likes, crowd_interest_sim,
    topic shares, persona similarity and text drift of its posts, its action mix, its reward
    and (trainable cohorts) its update's metrics; and `likes_given`: the likes its agents gave
    to posts of each cohort's agents and of the crowd (who likes whom)."""
    co = setup.cohorts
    cohort_of = np.asarray(co.agent_cohort)
    row = cohort_of[np.asarray(v.agent)]                                  # [T, B]
    types, created = np.asarray(v.action_type), np.asarray(v.created)
    is_post = created & np.isin(types, [int(ActionType.CREATE_POST), int(ActionType.QUOTE_POST)])
    eng, sc = np.asarray(v.engagement), np.asarray(v.score)
    applied = (np.asarray(v.reason) == 0) & np.asarray(v.parsed)
    liked = applied & (types == int(ActionType.LIKE_POST))
    author = np.asarray(v.target_author)
    names = {int(t): t.name.lower() for t in ActionType}
    post_cohort = row.reshape(-1)[idx]
    emb = np.asarray(v.post_embedding)[kept]
    out: Dict[str, Any] = {}
    for c, name in enumerate(co.names):
        mine = row == c
        posts = is_post & mine
        likes = eng[..., 0][posts]
        n = int(posts.sum())
        given = {}
        by_agent = liked & mine & (author >= 0) & (author < setup.num_agents)
        author_cohort = cohort_of[np.clip(author, 0, setup.num_agents - 1)]
        for c2, name2 in enumerate(co.names):
            given[name2] = int((by_agent & (author_cohort == c2)).sum())
        given["crowd"] = int((liked & mine & (author >= setup.num_agents)).sum())
        sel = post_cohort == c
        m = {"trainable": bool(co.trainable[c]), "agents": int(len(co.members[c])),
             "avg_likes_per_post": float(likes.mean()) if n else 0.0,
             "zero_like_share": float((likes == 0).mean()) if n else 0.0,
             "positive_engagement_share": (float((eng[..., :POSITIVE].sum(-1)[posts] > 0)
                                                 .mean()) if n else 0.0),
             "total_posts": n, "total_likes": int(likes.sum()),
             "reward_mean": float(sc[mine].mean()) if mine.any() else 0.0,
             "action_mix": {names[k]: int(((types == k) & mine).sum())
                            for k in np.unique(types[mine])},
             "likes_given": given, **negative_engagement(eng, posts)}
        m.update(topic_metrics(setup, text, emb[sel]))
        mine = [t for t, s_ in zip(texts, sel) if s_]
        m.update(_text_metrics(setup, text, v, kept, idx[sel], eng, mine, emb=emb[sel],
                               top_posts=False))
        if co.trainable[c]:
            slot = co.slots[c]
            m["ppo"] = {k: float(np.asarray(x).reshape(-1)[slot]) for k, x in upd.items()}
        out[name] = m
    return out


def negative_engagement(eng: np.ndarray, posts: np.ndarray) -> Dict[str, int]:
    """{"total_reports", "total_dislikes"} the `posts` [T, B] drew within the horizon, where
    the run records them (engagement [T, B, 5]); {} otherwise."""
    if eng.shape[-1] <= POSITIVE:
        return {}
    return {"total_reports": int(eng[..., POSITIVE][posts].sum()),
            "total_dislikes": int(eng[..., POSITIVE + 1][posts].sum())}


def _post_texts(setup: Setup, v: EpochView, kept, idx) -> List[str]:
    """The text of the epoch's first posts (decoded on the host, action prefix "post:" /
    "quote <n>:" cut; tool_call: the call's text argument)."""
    toks, tmask = np.asarray(v.post_tokens)[kept], np.asarray(v.post_mask)[kept]
    texts = [setup.tokenizer.decode(toks[i][tmask[i]], skip_special_tokens=True)
             for i in range(len(idx))]
    if setup.tool_call:  # the call's text argument (the host-side reference parser)
        c = setup.config
        sp = setup.social_params
        texts = [tool_calls.parse_tool_call_text(
            t, c.agents.actions, sp.feed_size, sp.feed_comments)[3] or "" for t in texts]
    else:
        texts = [t.split(":", 1)[-1].strip() for t in texts]
    return texts


def _text_metrics(setup: Setup, text: Text, v: EpochView, kept, idx, eng, texts,
                  emb: Optional[np.ndarray] = None, top_posts: bool = True) -> Dict[str, Any]:
    """The text metrics of the epoch's first posts (`texts`, at flat rows `idx`): persona
    similarity, text drift and the 3 most-liked posts (ties: earliest first) for summary.md.
    emb: their embeddings (default: the view's kept ones); top_posts=False: persona similarity and
    drift only."""
    m: Dict[str, Any] = {}
    authors = [int(a) for a in np.asarray(v.agent).reshape(-1)[idx]]
    post_likes = eng[..., 0].reshape(-1)[idx]
    # How close the agents' posts stay to their own persona (unit embeddings): a drift
    # towards the crowd's taste shows as this falling while crowd_interest_sim rises.
    persona = np.asarray(text.agent_interest)
    persona = persona / np.maximum(np.linalg.norm(persona, axis=-1, keepdims=True), 1e-12)
    emb = np.asarray(v.post_embedding)[kept] if emb is None else emb
    m["persona_sim"] = (float(np.mean(np.sum(emb * persona[authors], axis=-1)))
                        if len(authors) else 0.0)
    m["drift"] = report.text_drift(texts, authors)
    if not top_posts:
        return m
    top = sorted(range(len(texts)), key=lambda i: (-float(post_likes[i]), i))[:3]
    m["posts"] = [{"text": texts[i], "likes": int(post_likes[i]), "agent": authors[i]}
                  for i in top]
    if texts:  # the least-liked post (ties: earliest), for the end-of-run console story
        low = min(range(len(texts)), key=lambda i: (float(post_likes[i]), i))
        m["worst_post"] = {"text": texts[low], "likes": int(post_likes[low]),
                           "agent": authors[low]}
    return m


def topic_metrics(setup: Setup, text: Text, emb: np.ndarray) -> Dict[str, Any]:
    """Where the agents' posts (embeddings [n, d]) sit among the crowd's topics:
    `crowd_interest_sim` = mean cosine to the crowd's interest centre; `topic_share` = share
    of posts nearest each topic's centroid (topic drift shows here)."""
    if not len(emb):
        return {"crowd_interest_sim": 0.0, "topic_share": {}}
    near = np.argmax(emb @ np.asarray(text.topic_centroids).T, axis=1)
    counts = np.bincount(near, minlength=len(setup.topics)) / len(emb)
    return {"crowd_interest_sim": float((emb @ np.asarray(text.crowd_center)).mean()),
            "topic_share": {setup.topics[i]: float(c) for i, c in enumerate(counts) if c}}


def samples(setup: Setup, v: EpochView, epoch: int, n: Optional[int] = None) -> List[dict]:
    """The last tick's answers (at most n, default train.log_samples): epoch, agent, text,
    score."""
    n = int(setup.config.train.log_samples) if n is None else n
    toks, mask = np.asarray(v.last_tokens), np.asarray(v.last_mask)
    sc, agent = np.asarray(v.score)[-1], np.asarray(v.agent)[-1]
    out = []
    for a in range(min(n, toks.shape[0])):
        out.append({"epoch": epoch, "agent": int(agent[a]),
                    "text": setup.tokenizer.decode(toks[a][mask[a]], skip_special_tokens=True),
                    "score": float(sc[a])})
    return out


def society_metrics(setup: Setup, state: RunState) -> Dict[str, Any]:
    """The society at the end of the epoch: `cascades`, how far its alive original posts
    spread (`social.cascades`: size, depth, breadth and half time of their repost / quote
    trees, as percentiles), `cascade_trees`, the largest of those trees with their root's text
    (`cascades.trees`), and `polarisation` of its follow graph
    (`social.polarisation.summary`; the shuffle's key is the seed folded with the epoch,
    apart from the run's own keys)."""
    soc = state.society
    epoch = int(sharding.to_host(state.epoch))
    key = jax.random.fold_in(jax.random.key(int(setup.config.seed) + 104729), epoch)
    pol = sharding.to_host(_polarisation(key, soc, params=setup.social_params))
    c = sharding.to_host(_cascades(soc.posts))
    posts = sharding.to_host(soc.posts.replace(tokens=None, embedding=None))
    largest = cascades.trees(c, posts, n=_TREES)
    # the roots' text, for the report's cascade trees (a gather of static shape [_TREES, L])
    slots = np.zeros((_TREES,), np.int32)
    slots[:len(largest)] = [t["root"] for t in largest]
    toks = np.asarray(sharding.to_host(_rows(soc.posts.tokens, slots)))
    for tree, row in zip(largest, toks):
        tree["text"] = setup.tokenizer.decode(row[row >= 0], skip_special_tokens=True)
    return {"cascades": cascades.summary(c), "cascade_trees": largest,
            "polarisation": {k: int(v) if k == "follow_edges" else
                             (None if np.isnan(v) else float(v)) for k, v in pol.items()}}


def code_bonus(setup: Setup, ro: Rollout) -> np.ndarray:
    """Host side: [T, A] bonus for comments whose code passes the commented problem's tests.
    A problem post is one whose text came from the problem bank (seed/crowd authors)."""
    bonus = np.zeros(ro.created_id.shape, np.float32)
    if not setup.code:
        return bonus
    types, ok = np.asarray(ro.action_type), np.asarray(ro.created_id) >= 0
    target, author = np.asarray(ro.target), np.asarray(ro.target_author)
    answer = ok & (types == int(ActionType.CREATE_COMMENT)) & (author >= setup.num_agents)
    idx = np.argwhere(answer)
    if not len(idx):
        return bonus
    toks, mask = np.asarray(ro.tokens), np.asarray(ro.mask)
    texts = [setup.tokenizer.decode(toks[t, a][mask[t, a]], skip_special_tokens=True)
             .split(":", 1)[-1] for t, a in idx]
    problems = [int(target[t, a]) % len(code_problems.PROBLEMS) for t, a in idx]
    c = setup.config.code
    passed = code_problems.verify(texts, problems, float(c.timeout_s), int(c.memory_mb))
    bonus[tuple(idx.T)] = np.where(passed, float(c.bonus), 0.0)
    return bonus


def interview(setup: Setup, state: RunState, question: str, max_new_tokens: int = 48
              ) -> List[dict]:
    """Every LLM agent answers `question` in its own context, outside the society: its
    persona and the feed the recommender would show it now, with the question in place of
    the action instruction; greedy decoding by the current policy. Nothing is posted,
    marked seen or rewarded, and `state` is not changed. Returns one
    {"epoch", "agent", "persona", "question", "answer"} per agent."""
    if not str(question).strip():
        raise ValueError("an interview question must be non-empty")
    template = setup_lib.prompt_template(setup.config, setup.tokenizer, setup.social_params,
                                         setup.personas, str(question).strip(), "Your answer:")
    sampling = SamplingConfig(max_new_tokens=int(max_new_tokens), temperature=0.0,
                              stop_token_ids=setup.stop_ids, prompt_bucket=template.max_len)
    epoch = int(sharding.to_host(state.epoch))
    # The feed's exploration draws from its own key: the run's keys are not touched.
    key = jax.random.fold_in(jax.random.key(int(setup.config.seed) + 15485863), epoch)
    co = setup.cohorts
    slots = None if co is None else jnp.asarray(co.slots, jnp.int32)[co.agent_cohort]
    out = _interview_answers(setup.pdef, setup.social_params, template, sampling,
                             state.train.params, state.train.ref_params, state.society, key,
                             slots)
    toks, mask = sharding.to_host((out.tokens, out.mask))
    return [{"epoch": epoch, "agent": a, "persona": setup.personas[a],
             "question": str(question).strip(),
             "answer": setup.tokenizer.decode(toks[a][mask[a]],
                                             skip_special_tokens=True).strip()}
            for a in range(setup.num_agents)]


def export_names(setup: Setup) -> tuple:
    """The run's exports, relative to its workdir: "export" (the final policy) or, with
    cohorts, "export/<name>" per trainable cohort; and "initial" (the policy before any
    update, which launch/eval.py compares with)."""
    if setup.cohorts is None:
        return ("export", "initial")
    return tuple(f"export/{setup.cohorts.names[c]}" for c in setup.cohorts.trained) + ("initial",)
