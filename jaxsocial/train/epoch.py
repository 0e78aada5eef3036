"""One Social-RL epoch as pure functions over explicit pytrees (purejaxrl's `make_train` shape).

    setup = train.setup.build_setup(config)   # frozen: templates, vocab, sampling, update, ...
    fns = make_epoch(setup)
    state, update_metrics, view = jax.jit(fns.epoch)(state, grammar, encoder)

`make_epoch` reads the set-up once (templates, action vocabularies, sampling, the update, the
society's knobs, the society encoder's definition) and returns closures that hold those values
and nothing mutable. `grammar` is `setup.grammar`; `encoder` the society encoder's frozen input
(`encoder_input`: the sentence encoder's weights, or the reference encoder's centre and
projection). Each function has its own builder here (`make_embed`, `make_rollout` over
`make_agent_tick`, `make_social_reward`, `make_score_rollout`, `make_view`):

- `embed(ref_params, encoder, content) -> [B, d]`: the society's frozen encoder
  (`society.encoder`: the sentence encoder, or the reference policy's pooled states, centred,
  through a fixed projection);
- `rollout(params, ref_params, society, key, grammar, encoder) -> (society, Rollout)`: a
  `lax.scan` over the epoch's ticks. The LLM agents read their feed, the policy answers (under
  the action grammar in `constrained` mode), the answer is parsed into society actions, the
  society steps (`society.step` reports each tick's engagement and follower deltas), then
  `reward.horizon - 1` crowd-only "settle" ticks let every post of the epoch see its full
  horizon;
- `social_reward(Rollout) -> (score [T, B], engagement [T, B, E])`: the social reward;
- `score_rollout(train, Rollout, bonus, grammar) -> (Trajectory, score, engagement,
  logprob_gap)`: the scoring pass (policy and reference log-probs, values:
  `rl.policy.score_batch`) over the epoch's trajectories;
- `update(train, Trajectory, grammar) -> (train, metrics)`: PPO or GRPO (`rl.ppo` / `rl.grpo`);
- `view(Rollout, score, engagement, gap) -> EpochView`: what metrics and samples read;
- `begin(RunState) -> (key, rollout key)` and `end(RunState, key, society, train)
  -> RunState`: the epoch's key split and the new state, shared by both paths;
- `epoch(RunState, grammar, encoder) -> (RunState, update metrics, EpochView)`: all of the
  above in one program. The host-reward path (`train.run`) calls the same `begin`, `rollout`,
  `score_rollout`, `update` and `end` as three programs with the host's bonus in between.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsocial.agents import actions, prompting, tool_calls
from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.generation.generate import generate_from_state
from jaxsocial.rl import buffer as buffer_lib
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl import policy as policy_lib
from jaxsocial.rl import rewards as rewards_lib
from jaxsocial.rl.state import TrainState
from jaxsocial.social import activation, society
from jaxsocial.social.actions import ActionType
from jaxsocial.social.state import SocialState
from jaxsocial.train import cohorts as cohorts_lib
from jaxsocial.train import sharding, society_encoder
from jaxsocial.train.setup import RunState, Setup

Array = jax.Array


@struct.dataclass
class Rollout:
    """Per tick t and acting agent b (leading dims [T, B], B = agents.active_per_tick), plus
    per recorded tick (T agent ticks + S settle ticks); A = all LLM agents."""

    agent: Array            # [T, B] int32 which agents acted (B = agents.active_per_tick)
    prompt_ids: Array       # [T, B, Lp] int32
    prompt_mask: Array      # [T, B, Lp] bool
    tokens: Array           # [T, B, N] int32
    logprobs: Array         # [T, B, N] float32
    mask: Array             # [T, B, N] bool
    action_type: Array      # [T, B] int32 parsed ActionType (MALFORMED if unparsable)
    parsed: Array           # [T, B] bool
    failure: Array          # [T, B] int32 tool_calls.FAIL_* (tool_call: by kind; else 0 / 1)
    reason: Array           # [T, B] int32 society Reason for the applied action
    created_id: Array       # [T, B] int32 post id created by the action, -1 if none
    target: Array           # [T, B] int32 target post / user id of the action, -1 if none
    target_author: Array    # [T, B] int32 author of the targeted feed post, -1 if none
    embedding: Array        # [T, B, d] float32 society-encoder embedding of the answer's text
    tick: Array             # [T] int32 society tick of each agent tick
    deltas: Array           # [T + S, P, E] int32 engagement gained per slot per recorded tick
    slot_ids: Array         # [T + S, P] int32 post id in each slot after each recorded tick
    follower_delta: Array   # [T + S, A] int32 followers gained by each agent per recorded tick
    crowd_posts: Array      # [T + S] int32 posts created by the crowd per recorded tick
    values: Optional[Array] = None  # [T, B, N] float32 old values (rl.old_values="rollout")


@struct.dataclass
class EpochView:
    """What an epoch's metrics and samples read, reduced on the device (`EpochFns.view`):
    per-trajectory scalars [T, B], the text of the first K posts in tick order
    (K = train.text_metrics_posts) and the last tick's answers. The rollout's prompts, log-probs
    and per-slot records stay on the device, unless train.dataset asks for its steps."""

    agent: Array           # [T, B] int32
    action_type: Array     # [T, B] int32
    parsed: Array          # [T, B] bool
    failure: Array         # [T, B] int32 tool_calls.FAIL_*
    reason: Array          # [T, B] int32
    target_author: Array   # [T, B] int32 author of the targeted feed post, -1 if none
    created: Array         # [T, B] bool the action created a post / comment
    score: Array           # [T, B] float32 trajectory score
    engagement: Array      # [T, B, E] float32 engagement of the created post within the horizon
    tokens: Array          # [] float32 response tokens generated in the epoch
    crowd_posts: Array     # [] int32
    post_index: Array      # [K] int32 flat index t * B + b of the first K posts, -1 padding
    post_tokens: Array     # [K, N] int32
    post_mask: Array       # [K, N] bool
    post_embedding: Array  # [K, d] float32
    last_tokens: Array     # [B, N] int32 the last agent tick's answers (samples)
    last_mask: Array       # [B, N] bool
    logprob_gap: Array     # [] float32
    # train.dataset: the whole rollout for the trajectory dataset (else None)
    steps: Optional[Rollout] = None


class EpochFns(NamedTuple):
    """The pure functions of one epoch (see the module docstring for their signatures)."""

    embed: Callable
    rollout: Callable
    social_reward: Callable
    score_rollout: Callable
    update: Callable
    view: Callable
    begin: Callable
    end: Callable
    epoch: Callable


def encoder_input(setup: Setup, weights, text):
    """The society encoder's frozen input to the rollout and the epoch (`encoder=`): the
    sentence encoder's weights (`society.encoder="minilm"`) or the reference encoder's
    (centre [H] (`text.center`), projection [H, d]). Passed as an argument, never closed over,
    so no program bakes it in: runs that differ only in `seed` share their compiled programs."""
    if setup.encoder.kind == "minilm":
        return weights.encoder
    return (text.center, jnp.asarray(setup.encoder.projection))


def rows_on_data_axes(tree, mesh):
    """Inside jit: constrain every leaf's leading (row) dim to the mesh's data axes, where they
    divide it (`sharding.tree_data_shardings`); a no-op on one device."""
    if mesh.size == 1:
        return tree
    return jax.lax.with_sharding_constraint(tree, sharding.tree_data_shardings(tree, mesh))


def make_embed(setup: Setup):
    """-> embed(ref_params, encoder, content [B, L] policy tokens) -> unit embeddings [B, d]:
    the society's frozen encoder. encoder: `encoder_input` (the sentence encoder's weights, or
    the reference encoder's (centre [H], subtracted from the reference policy's pooled states;
    projection [H, d]))."""
    encoder_kind = setup.encoder.kind  # society.encoder (train.society_encoder)
    encoder_graphdef, retokenizer = setup.encoder.graphdef, setup.encoder.retokenizer
    pdef = setup.pdef

    def embed(ref_params, encoder, content: Array) -> Array:
        if encoder is None:
            raise ValueError(f"society.encoder={encoder_kind!r}: pass the encoder's input "
                             f"(encoder=epoch.encoder_input(...)) to the rollout / epoch")
        if encoder_kind == "minilm":
            return society_encoder.minilm_embed(encoder_graphdef, retokenizer, encoder, content)
        center, projection = encoder
        return society_encoder.project(
            society_encoder.pooled_states(pdef.graphdef, ref_params, content), center,
            projection)

    return embed


def make_acting_agents(setup: Setup):
    """-> acting_agents(key, soc) -> [B] int32: the tick's acting agents, by the hour's
    activity (OASIS's profiles), a uniform random subset, or all agents (with cohorts: within
    each cohort, the cohorts' rows in order)."""
    sp, num_agents, active, cohorts = (setup.social_params, setup.num_agents, setup.active,
                                       setup.cohorts)
    weights_of_hour = None if setup.activation is None else jnp.asarray(setup.activation)

    def acting_agents(key, soc: SocialState) -> Array:
        if cohorts is not None:
            hourly = None
            if weights_of_hour is not None:
                hourly = weights_of_hour[:, activation.hour_of_tick(soc.tick, sp)]
            return cohorts_lib.acting_agents(cohorts, key, hourly, activation.sample_active)
        if weights_of_hour is not None:
            hour = activation.hour_of_tick(soc.tick, sp)
            return activation.sample_active(key, weights_of_hour[:, hour], active)
        if active < num_agents:
            return jnp.sort(jax.random.permutation(key, num_agents)[:active]).astype(jnp.int32)
        return jnp.arange(num_agents, dtype=jnp.int32)

    return acting_agents


def parse_answers(setup: Setup, out):
    """(parsed actions, failure [B] int32 tool_calls.FAIL_*) of the tick's generated answers:
    the tool-call scanner (agents.action_mode="tool_call", failures by kind) or the action
    parser (failure: FAIL_NO_JSON where an answer does not parse)."""
    content_len = setup.social_params.content_len
    if setup.tool_call:
        return tool_calls.parse_tool_call(setup.tools, out.tokens, out.mask, content_len)
    parsed = actions.parse(setup.vocab, out.tokens, out.mask, content_len)
    failure = jnp.where(parsed.parsed, tool_calls.FAIL_OK,
                        tool_calls.FAIL_NO_JSON).astype(jnp.int32)
    return parsed, failure


def _record(soc: SocialState, info: society.StepInfo):
    """What every recorded tick (agent or settle) keeps for the social reward."""
    return info.engagement_delta, soc.posts.id, info.follower_delta, info.crowd_posts


def make_agent_tick(setup: Setup, embed, row_slot):
    """-> agent_tick(soc, key, weights, params, ref_params, grammar, encoder)
    -> ((soc, key), (Rollout fields of the tick, its record)): the LLM agents read their feed,
    the policy (`weights`) answers, the answers are parsed into society actions and the society
    steps. row_slot [B]: with cohorts, each row's adapter (its value head, rl.old_values=
    "rollout")."""
    sp, mesh, pdef = setup.social_params, setup.mesh, setup.pdef
    template, sampling = setup.template, setup.sampling
    # rl.old_values="rollout": the value head reads the generator's hidden states, and the
    # policy's scoring forward is skipped for the values too.
    rollout_values = setup.old_values == "rollout"
    acting_agents = make_acting_agents(setup)

    def agent_tick(soc, key, weights, params, ref_params, grammar, encoder):
        key, k_act, k_feed, k_gen, k_step = jax.random.split(key, 5)
        agents = acting_agents(k_act, soc)
        soc, feed = society.observe(k_feed, soc, agents, sp)
        feed_authors = jnp.where(feed.valid, soc.posts.author[feed.slots], -1)
        view = prompting.feed_view(soc.posts, feed.slots, feed.valid, sp.feed_comments or None)
        ids, mask = prompting.assemble(template, agents, view)
        ids, mask = rows_on_data_axes((ids, mask), mesh)  # each device: its agents
        out = generate_from_state(pdef.graphdef, weights, ids, mask, k_gen, sampling,
                                  grammar, step_hidden=rollout_values)
        parsed, failure = parse_answers(setup, out)
        emb = embed(ref_params, encoder, parsed.content)
        acts = actions.to_actions(parsed, agents, feed.ids, feed.valid,
                                  feed_authors, emb, view.comment_ids)
        soc, info = society.step(k_step, soc, acts, sp)
        ys = dict(agent=agents, prompt_ids=ids, prompt_mask=mask, tokens=out.tokens,
                  logprobs=out.logprobs, mask=out.mask, action_type=parsed.type,
                  parsed=parsed.parsed, failure=failure, reason=info.agent.reason,
                  created_id=info.agent.created_id, tick=info.tick, target=acts.target,
                  embedding=emb,
                  target_author=jnp.where(parsed.feed_pos >= 0, jnp.take_along_axis(
                      feed_authors, jnp.maximum(parsed.feed_pos, 0)[:, None], 1)[:, 0], -1))
        if rollout_values:
            v = (policy_lib.head_values(params, out.step_hidden) if row_slot is None else
                 cohorts_lib.row_values(params["value"]["head"], out.step_hidden, row_slot))
            ys["values"] = jnp.where(out.mask, v, 0.0)
        return (soc, key), (ys, _record(soc, info))

    return agent_tick


def make_rollout(setup: Setup, embed):
    """-> rollout(params, ref_params, society, key, grammar=None, encoder=None)
    -> (society, Rollout): `rollout.ticks_per_epoch` agent ticks (`make_agent_tick`) in one
    `lax.scan`, then `reward.horizon - 1` crowd-only settle ticks (`reward.settle`)."""
    sp, pdef, cohorts = setup.social_params, setup.pdef, setup.cohorts
    ticks = int(setup.config.rollout.ticks_per_epoch)
    settle = sp.reward_horizon - 1 if setup.config.reward.settle else 0
    # agents.cohorts: each row of a tick answers with its cohort's adapter (train.cohorts)
    row_slot = None if cohorts is None else jnp.asarray(cohorts.row_slot)
    agent_tick = make_agent_tick(setup, embed, row_slot)

    def settle_tick(carry, _):
        soc, key = carry
        key, k_step = jax.random.split(key)
        soc, info = society.step(k_step, soc, None, sp)
        return (soc, key), _record(soc, info)

    def rollout(params, ref_params, soc: SocialState, key: Array, grammar=None, encoder=None):
        if cohorts is None:
            weights = policy_lib.policy_weights(pdef, params, ref_params)
        else:  # one batched forward, each row through its cohort's adapter (frozen: none)
            weights = lora_lib.adapt(ref_params, params["policy"], pdef.lora, rows=row_slot)

        def tick(carry, _):
            return agent_tick(*carry, weights, params, ref_params, grammar, encoder)

        (soc, key), (ys, rec) = jax.lax.scan(tick, (soc, key), None, length=ticks)
        if settle > 0:
            (soc, key), rec_s = jax.lax.scan(settle_tick, (soc, key), None, length=settle)
            rec = jax.tree.map(lambda x, y: jnp.concatenate([x, y]), rec, rec_s)
        deltas, slot_ids, follower_delta, crowd_posts = rec
        return soc, Rollout(**ys, deltas=deltas, slot_ids=slot_ids,
                            follower_delta=follower_delta, crowd_posts=crowd_posts)

    return rollout


def non_post_base(mode: str, non_post: float, score, made, onehot=None):
    """What an answer that created nothing earns (`reward.non_post_mode`): "constant" =
    reward.non_post; "mean" and "skip" = the epoch's mean post score (onehot [M, C]: with
    cohorts, its cohort's), so posting pays only when the post beats the average. "skip" scores
    them the same way (for GRPO's group statistics) and leaves them out of the update
    (`make_score_rollout`)."""
    if mode == "constant":
        return non_post
    if onehot is None:
        return jnp.sum(jnp.where(made, score, 0.0)) / jnp.maximum(jnp.sum(made), 1)
    total = jnp.where(made, score, 0.0) @ onehot                       # [C]
    return (total / jnp.maximum(made.astype(jnp.float32) @ onehot, 1)) @ onehot.T


def make_social_reward(setup: Setup):
    """-> social_reward(Rollout) -> (score [T, B], engagement [T, B, E]): each post's
    engagement within the horizon (0 where no post) by the reward's weights, plus its author's
    new followers; answers that created nothing score `non_post_base`. With cohorts each row by
    its cohort's weights (`make_cohort_reward`)."""
    r = setup.config.reward
    horizon = setup.social_params.reward_horizon
    channels = setup.social_params.engagement_channels  # E: 3, or 5 with reports and dislikes
    reward_weights = tuple(float(r.get(k, 0.0)) for k in cohorts_lib.REWARD_KEYS[:channels])
    new_followers = float(r.new_followers)
    mode = r.get("non_post_mode", "constant")  # checked by train.checks.check
    non_post = float(r.non_post)
    cohort_reward = None if setup.cohorts is None else make_cohort_reward(setup)

    def social_reward(ro: Rollout):
        t, b = ro.created_id.shape
        created = ro.created_id.reshape(-1)
        created_tick = jnp.repeat(ro.tick, b)
        eng = rewards_lib.engagement_within_horizon(created, created_tick, ro.deltas,
                                                    ro.slot_ids, horizon, first_tick=ro.tick[0])
        if cohort_reward is not None:
            return cohort_reward(ro, eng, created, created_tick)
        score = eng @ jnp.asarray(reward_weights, jnp.float32)
        if new_followers:
            score += new_followers * rewards_lib.followers_within_horizon(
                ro.agent.reshape(-1), created_tick, ro.follower_delta, horizon, ro.tick[0],
                valid=created >= 0)
        made = created >= 0
        score = jnp.where(made, score, non_post_base(mode, non_post, score, made))
        return score.reshape(t, b), eng.reshape(t, b, -1)

    return social_reward


def make_cohort_reward(setup: Setup):
    """-> cohort_reward(Rollout, engagement [T * B, E], created, created_tick) -> (score
    [T, B], engagement [T, B, E]): the social reward with cohorts, each row scored by its
    cohort's reward weights (non-posts: its cohort's mean post score, in the "mean" and "skip"
    modes)."""
    cohorts, r = setup.cohorts, setup.config.reward
    horizon = setup.social_params.reward_horizon
    channels = setup.social_params.engagement_channels
    mode, non_post = r.get("non_post_mode", "constant"), float(r.non_post)
    row_weights = jnp.asarray(cohorts.reward[cohorts.row_cohort])        # [B, 6]
    row_onehot = jax.nn.one_hot(jnp.asarray(cohorts.row_cohort), cohorts.num)  # [B, C]
    followers_col = cohorts_lib.REWARD_KEYS.index("new_followers")
    cohort_followers = bool(np.any(cohorts.reward[:, followers_col]))

    def cohort_reward(ro: Rollout, eng, created, created_tick):
        t, b = ro.created_id.shape
        w = jnp.tile(row_weights, (t, 1))                                     # [T * B, 6]
        score = jnp.sum(eng * w[:, :channels], axis=-1)
        if cohort_followers:
            score += w[:, followers_col] * rewards_lib.followers_within_horizon(
                ro.agent.reshape(-1), created_tick, ro.follower_delta, horizon, ro.tick[0],
                valid=created >= 0)
        made = created >= 0
        score = jnp.where(made, score, non_post_base(mode, non_post, score, made,
                                                     jnp.tile(row_onehot, (t, 1))))
        return score.reshape(t, b), eng.reshape(t, b, -1)

    return cohort_reward


def _flat(x: Array) -> Array:
    """[T, B, ...] -> [T * B, ...]."""
    return x.reshape((-1,) + x.shape[2:])


def _trajectory(ro: Rollout, scores: Array, skip_non_posts: bool):
    """The epoch's trajectories [T * B, ...] with their scores; skip_non_posts
    (`reward.non_post_mode="skip"`): answers that created nothing carry no gradient."""
    response_mask = _flat(ro.mask)
    if skip_non_posts:
        response_mask = response_mask & (_flat(ro.created_id) >= 0)[:, None]
    return buffer_lib.make_trajectory(_flat(ro.prompt_ids), _flat(ro.prompt_mask),
                                      _flat(ro.tokens), response_mask, scores=scores)


def _with_fsm_states(batch, grammar):
    """The grammar's FSM states [B, N] int32 along the responses, never [B, N, V] masks: the
    loss rebuilds each chunk's allowed set from the grammar tables."""
    if grammar is None:
        return batch
    return batch.replace(fsm_states=grammar_lib.step_states(
        grammar, batch.response_tokens, batch.response_mask))


def _scoring_pass(setup: Setup):
    """-> score(train, batch, rollout_logprobs, rollout_values, grammar) -> (batch with its old
    and reference log-probs and values, logprob gap): `policy.score_batch` over one batch of
    trajectories; the gap is how far the rollout's own log-probs are from the re-scored ones
    (~0), NaN where the rollout's were reused (`rl.old_logprobs`: nothing re-scored)."""
    pdef, rl_config = setup.pdef, setup.rl_config
    reuse_logprobs = setup.old_logprobs == "rollout"

    def score(train: TrainState, batch, rollout_lp, rollout_v, grammar):
        lp, ref, values = policy_lib.score_batch(pdef, train.params, train.ref_params, batch,
                                                 rl_config, grammar, rollout_logprobs=rollout_lp,
                                                 rollout_values=rollout_v)
        batch = batch.replace(old_logprobs=lp, ref_logprobs=ref, values=values)
        if reuse_logprobs:
            return batch, jnp.float32(jnp.nan)
        return batch, jnp.max(jnp.abs(jnp.where(batch.response_mask, lp - rollout_lp, 0.0)))

    return score


def make_score_rollout(setup: Setup, social_reward):
    """-> score_rollout(train, Rollout, bonus [T, B], grammar=None) -> (Trajectory, score,
    engagement, logprob_gap): the social reward plus the host's bonus, normalised
    (`reward.normalize`), and the scoring pass over the epoch's trajectories, each device
    scoring its share of the rows. With cohorts: `make_score_cohort_rollout`."""
    if setup.cohorts is not None:
        return make_score_cohort_rollout(setup, social_reward)
    mesh, normalize = setup.mesh, setup.config.reward.normalize
    skip = setup.config.reward.get("non_post_mode", "constant") == "skip"
    score = _scoring_pass(setup)

    def score_rollout(train: TrainState, ro: Rollout, bonus: Array, grammar=None):
        s, eng = social_reward(ro)
        s = s + bonus
        s_n = rewards_lib.normalize_scores(s.reshape(-1), normalize)
        batch = _with_fsm_states(_trajectory(ro, s_n, skip), grammar)
        batch, rollout_lp, rollout_v = rows_on_data_axes(
            (batch, _flat(ro.logprobs), None if ro.values is None else _flat(ro.values)), mesh)
        batch, gap = score(train, batch, rollout_lp, rollout_v, grammar)
        return batch, s, eng, gap

    return score_rollout


def make_score_cohort_rollout(setup: Setup, social_reward):
    """`make_score_rollout` with cohorts: the trajectories [K, R, ...] of each trainable
    cohort, scored by its own adapter and value head, scores normalised within the cohort."""
    mesh, normalize = setup.mesh, setup.config.reward.normalize
    skip = setup.config.reward.get("non_post_mode", "constant") == "skip"
    score = _scoring_pass(setup)
    cohort_rows = jnp.asarray(setup.cohorts.rows(int(setup.config.rollout.ticks_per_epoch)))

    def score_rollout(train: TrainState, ro: Rollout, bonus: Array, grammar=None):
        s, eng = social_reward(ro)
        s = s + bonus
        whole = _trajectory(ro, s.reshape(-1), skip)
        rollout_lp, rollout_v = _flat(ro.logprobs), None if ro.values is None else _flat(ro.values)

        def one(train_k: TrainState, rows: Array):
            batch = jax.tree.map(lambda x: x[rows], whole)
            batch = batch.replace(scores=rewards_lib.normalize_scores(batch.scores, normalize))
            batch = _with_fsm_states(batch, grammar)
            batch, lp_k, v_k = rows_on_data_axes(
                (batch, rollout_lp[rows], None if rollout_v is None else rollout_v[rows]), mesh)
            return train_k, score(train_k, batch, lp_k, v_k, grammar)

        _, (batch, gap) = cohorts_lib.map_cohorts(one, train, cohort_rows)
        return batch, s, eng, jnp.max(gap)

    return score_rollout


def make_view(setup: Setup):
    """-> view(Rollout, score, engagement, gap) -> EpochView: the epoch reduced to what the
    host's metrics and samples read (the first `train.text_metrics_posts` posts' text)."""
    text_posts = int(setup.config.train.get("text_metrics_posts", 4096))
    dataset = bool(setup.config.train.get("dataset", False))

    def view(ro: Rollout, s: Array, eng: Array, gap: Array) -> EpochView:
        t, b = ro.created_id.shape
        created = ro.created_id >= 0
        is_post = created & ((ro.action_type == int(ActionType.CREATE_POST))
                             | (ro.action_type == int(ActionType.QUOTE_POST)))
        k = min(text_posts, t * b)
        (idx,) = jnp.nonzero(is_post.reshape(-1), size=k, fill_value=-1)
        safe = jnp.maximum(idx, 0)
        keep = (idx >= 0)[:, None]
        flat = lambda x: x.reshape((t * b,) + x.shape[2:])[safe]  # noqa: E731
        return EpochView(
            agent=ro.agent, action_type=ro.action_type, parsed=ro.parsed, failure=ro.failure,
            reason=ro.reason, target_author=ro.target_author, created=created, score=s,
            engagement=eng.astype(jnp.float32),
            tokens=jnp.sum(ro.mask).astype(jnp.float32), crowd_posts=jnp.sum(ro.crowd_posts),
            post_index=idx.astype(jnp.int32), post_tokens=jnp.where(keep, flat(ro.tokens), 0),
            post_mask=keep & flat(ro.mask), post_embedding=jnp.where(keep, flat(ro.embedding), 0),
            last_tokens=ro.tokens[-1], last_mask=ro.mask[-1], logprob_gap=gap,
            # the per-slot records and embeddings are not steps of an agent's episode
            steps=ro.replace(deltas=None, slot_ids=None, follower_delta=None, crowd_posts=None,
                             embedding=None, values=None) if dataset else None)

    return view


def make_epoch(setup: Setup) -> EpochFns:
    """The epoch's pure functions from a run's set-up (`train.setup.Setup`)."""
    mesh, compiled_update = setup.mesh, setup.update
    embed = make_embed(setup)
    rollout = make_rollout(setup, embed)
    social_reward = make_social_reward(setup)
    score_rollout = make_score_rollout(setup, social_reward)
    view = make_view(setup)

    def update(train: TrainState, batch, grammar=None):
        if setup.cohorts is None:
            return compiled_update.fn(train, batch, grammar)
        # with cohorts: each trainable cohort's update on its own rows [K, R, ...], in turn
        return cohorts_lib.map_cohorts(
            lambda t, b: compiled_update.fn(t, rows_on_data_axes(b, mesh), grammar),
            train, batch)

    def begin(state: RunState):
        """The epoch's keys: (the loop key carried on, the rollout's key)."""
        return jax.random.split(jax.random.wrap_key_data(state.key))

    def end(state: RunState, key: Array, soc, train) -> RunState:
        return RunState(train=train, society=soc, key=jax.random.key_data(key),
                        epoch=state.epoch + 1)

    def epoch(state: RunState, grammar=None, encoder=None):
        """Rollout, scores, scoring pass, update and the metrics' view: the same keys and steps
        as the three-program path (`train.run.Run.run_epoch` with a host-side reward)."""
        key, k_roll = begin(state)
        soc, ro = rollout(state.train.params, state.train.ref_params, state.society, k_roll,
                          grammar=grammar, encoder=encoder)
        no_bonus = jnp.zeros(ro.created_id.shape, jnp.float32)
        batch, s, eng, gap = score_rollout(state.train, ro, no_bonus, grammar=grammar)
        if setup.cohorts is None:  # (cohorts: each cohort's rows, inside `update`)
            batch = rows_on_data_axes(batch, mesh)  # as the host path's put_global: scored too
        train, upd = update(state.train, batch, grammar)
        return end(state, key, soc, train), upd, view(ro, s, eng, gap)

    return EpochFns(embed=embed, rollout=rollout, social_reward=social_reward,
                    score_rollout=score_rollout, update=update, view=view, begin=begin,
                    end=end, epoch=epoch)
