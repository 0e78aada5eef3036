"""One Social-RL epoch = rollout in the society (compiled) + social reward + PPO/GRPO update.

    run = SocialRL(config)                 # host-side set-up: model, tokenizer, society, PPO
    state = run.init_state()               # RunState: train state, society, key, epoch
    state, metrics, samples = run.run_epoch(state)

Rollout (one jitted program, `lax.scan` over ticks): the LLM agents read their recommended feed,
a prompt is assembled from pre-tokenized pieces (`social.prompting`), the policy generates their
action (under the action grammar in `constrained` mode), the answer is parsed into a society
action, the post text is embedded by the frozen reference model, the society applies the agents'
actions and lets the crowd react. After the epoch's ticks, `reward.horizon - 1` crowd-only
"settle" ticks let every post of the epoch see its full horizon. A post's score is the engagement
it received within the horizon (`rl.rewards`), the trajectory that created it gets that score,
and the update (PPO or GRPO) runs on all trajectories of the epoch. The reference model stays
the initial policy.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx, struct

from jaxsocial import models
from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.generation.generate import generate_from_state
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import checkpoint_hf, llama, zoo
from jaxsocial.rl import buffer as buffer_lib
from jaxsocial.rl import common as rl_common
from jaxsocial.rl import grpo as grpo_lib
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl import optim
from jaxsocial.rl import policy as policy_lib
from jaxsocial.rl import ppo as ppo_lib
from jaxsocial.rl import rewards as rewards_lib
from jaxsocial.rl.state import TrainState
from jaxsocial.social import activation, prompting, society, text_bank
from jaxsocial.social.actions import ActionType
from jaxsocial.social.state import SocialState, normalize
from jaxsocial.train import agent_actions, code_problems, config_check, memory, report, sharding

Array = jax.Array


@struct.dataclass
class RunState:
    """Everything a checkpoint holds: the RL train state, the society, the loop key, the epoch."""

    train: TrainState
    society: SocialState
    key: Array    # uint32 [2] raw PRNG key data
    epoch: Array  # int32: epochs completed


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
    failure: Array          # [T, B] int32 agent_actions.FAIL_* (tool_call: by kind; else 0 / 1)
    reason: Array           # [T, B] int32 society Reason for the applied action
    created_id: Array       # [T, B] int32 post id created by the action, -1 if none
    target: Array           # [T, B] int32 target post / user id of the action, -1 if none
    target_author: Array    # [T, B] int32 author of the targeted feed post, -1 if none
    embedding: Array        # [T, B, d] float32 frozen-encoder embedding of the answer's text
    tick: Array             # [T] int32 society tick of each agent tick
    deltas: Array           # [T + S, P, E] int32 engagement gained per slot per recorded tick
    slot_ids: Array         # [T + S, P] int32 post id in each slot after each recorded tick
    follower_delta: Array   # [T + S, A] int32 followers gained by each agent per recorded tick
    crowd_posts: Array      # [T + S] int32 posts created by the crowd per recorded tick


@struct.dataclass
class EpochView:
    """What an epoch's metrics and samples read, reduced on the device (`SocialRL._view_fn`):
    per-trajectory scalars [T, B], the text of the first K posts in tick order
    (K = train.text_metrics_posts) and the last tick's answers. The rollout's prompts, log-probs
    and per-slot records stay on the device."""

    agent: Array           # [T, B] int32
    action_type: Array     # [T, B] int32
    parsed: Array          # [T, B] bool
    failure: Array         # [T, B] int32 agent_actions.FAIL_*
    reason: Array          # [T, B] int32
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


def _load(config):
    """-> (model, tokenizer, stop_ids) through the one loader (`models.load`): the checkpoint,
    or a random `model.preset` with `config.tokenizer` (default: the tiny tokenizer)."""
    m = config.model  # model.require_checkpoint is checked by config_check
    return models.load(m.checkpoint or m.preset, dtype=m.dtype, param_dtype=m.param_dtype,
                       tokenizer=config.tokenizer or None, seed=int(config.seed),
                       remat=bool(m.remat), attention_chunk=int(m.get("attention_chunk", 0)))


class _BindGrammar:
    """A jitted function called with `grammar=` bound: `f(*args)` / `f.lower(*args)` pass the
    grammar pytree as a traced argument of the compiled program (never a baked constant)."""

    def __init__(self, jitted, grammar):
        self.jitted, self.grammar = jitted, grammar

    def __call__(self, *args):
        return self.jitted(*args, grammar=self.grammar)

    def lower(self, *args):
        return self.jitted.lower(*args, grammar=self.grammar)


class SocialRL:
    """Host-side set-up of one Social-RL run, and its compiled epoch pieces."""

    def __init__(self, config: ml_collections.ConfigDict, mesh=None):
        self.config = config
        config_check.check(config)  # before anything is built or compiled
        c = config
        if c.rl.algo not in ("ppo", "grpo"):
            raise ValueError(f"rl.algo={c.rl.algo!r}; choose 'ppo' or 'grpo'")
        if c.agents.action_mode not in ("constrained", "free", "tool_call"):
            raise ValueError(f"agents.action_mode={c.agents.action_mode!r}; choose "
                             f"'constrained', 'free' or 'tool_call'")
        self.tool_call = c.agents.action_mode == "tool_call"
        self.mesh = mesh if mesh is not None else sharding.make_mesh(tuple(c.mesh.shape))
        model, self.tokenizer, self.stop_ids = _load(c)
        self.model_config = model.config
        a = int(c.agents.num_agents)
        if a < 1:
            raise ValueError(f"agents.num_agents must be >= 1, got {a}")
        self.num_agents = a
        active = int(c.agents.get("active_per_tick", 0)) or a
        if not 1 <= active <= a:
            raise ValueError(f"agents.active_per_tick={active} must be in [1, num_agents={a}]")
        self.active = active  # B: agents acting each tick (a random subset when < A)
        # [A, 24] activity weights over the society's clock (None: a uniform subset).
        self.activation = activation.from_config(c.agents.get("activation", None), a,
                                                 int(c.seed))
        horizon = int(c.reward.horizon)
        if horizon < 1:
            raise ValueError(f"reward.horizon must be >= 1, got {horizon}")
        # The society's knobs (SocialParams), not to be confused with the policy's params.
        self.social_params = society.make_params(**dict(c.society), num_agents=a,
                                          reward_horizon=horizon)
        if self.social_params.num_users < a:
            raise ValueError(f"society.num_users={self.social_params.num_users} < "
                             f"agents.num_agents={a}")
        personas = [c.agents.personas[i % len(c.agents.personas)] for i in range(a)]
        instruction = c.agents.instruction
        if self.tool_call:  # the tools and their arguments (agents.tool_instruction: own text)
            instruction = (c.agents.get("tool_instruction", "") or agent_actions.tool_instruction(
                c.agents.actions, self.social_params.feed_size))
        self.template = prompting.PromptTemplate.build(
            self.tokenizer, personas, instruction, c.agents.footer,
            self.social_params.feed_size, self.social_params.content_len,
            names=[c.agents.names[i % len(c.agents.names)] for i in range(a)]
            if c.agents.names else None, newest_comment=bool(c.agents.newest_comment),
            num_users=self.social_params.num_users, feed_comments=self.social_params.feed_comments)
        self.vocab = agent_actions.ActionVocab.build(self.tokenizer, c.agents.actions,
                                                     self.social_params.feed_size, self.stop_ids,
                                                     self.social_params.feed_comments)
        self.tools = (agent_actions.ToolVocab.build(
            self.tokenizer, c.agents.actions, self.social_params.feed_size, model.config.vocab_size,
            self.social_params.feed_comments) if self.tool_call else None)
        n_new = int(c.rollout.max_new_tokens)
        longest_prefix = int(np.max(np.asarray(self.vocab.prefix_len)))
        max_text = min(self.social_params.content_len, n_new - longest_prefix - 1)
        if max_text < 1:
            raise ValueError(f"rollout.max_new_tokens={n_new} leaves no room for text after the "
                             f"longest action prefix ({longest_prefix} tokens) and a stop token")
        # Free text excludes special tokens only (id 0 is a real token, e.g. "!" in Llama-3).
        specials = sorted(set(self.tokenizer.added_tokens_decoder))
        self.grammar = (self.vocab.grammar(model.config.vocab_size, max_text, specials)
                        if c.agents.action_mode == "constrained" else None)
        self.sampling = SamplingConfig(
            max_new_tokens=n_new, temperature=float(c.rollout.temperature),
            top_k=int(c.rollout.top_k), top_p=float(c.rollout.top_p),
            stop_token_ids=self.stop_ids, prompt_bucket=self.template.max_len)
        self.rl_config = self._rl_config(c)
        lora = None
        if int(c.rl.lora_rank) > 0:
            lora = lora_lib.LoraConfig(rank=int(c.rl.lora_rank), alpha=float(c.rl.lora_alpha))
        pdef, params, ref = policy_lib.init_policy(
            model, jax.random.key(int(c.seed) + 1), lora=lora,
            value_mode="none" if c.rl.algo == "grpo" else c.rl.value_mode)
        self.pdef = pdef
        self._init_params, self._init_ref = params, ref
        make = grpo_lib.make_update if c.rl.algo == "grpo" else ppo_lib.make_update
        self.update = make(self.rl_config, pdef, grammar=self.grammar)
        # Frozen post encoder: reference hidden states, mean-pooled, fixed random projection.
        h, d = model.config.hidden_size, self.social_params.embed_dim
        self.projection = jax.random.normal(jax.random.key(int(c.seed) + 7919), (h, d)) / np.sqrt(h)
        self.code = c.code.enabled
        # One compiled program per epoch unless a reward is computed on the host (code bonus).
        self.fused = bool(c.train.get("fused_epoch", True)) and not self.code
        self._build_text(c, personas)
        self._check_memory(c)
        # The grammar enters each compiled program as an argument: closed over, XLA would bake
        # its [S, V] tables in as constants (and spend minutes constant-folding them).
        self._rollout = _BindGrammar(jax.jit(self._rollout_fn), self.grammar)
        self._score = _BindGrammar(jax.jit(self._score_fn), self.grammar)
        self._view = jax.jit(self._view_fn)
        self._epoch = None  # built at the first epoch, with the state's shardings pinned
        self.epoch_trace_count = 0

    # ------------------------------------------------------------------------------------------
    # set-up

    def _build_text(self, c, personas) -> None:
        """The society's text, embedded once by the frozen encoder (`social.text_bank`): the
        crowd's post and comment banks (`self.crowd_text`; configs/code.py: its problems, by
        post id), the crowd's interest descriptions (`self.interest_bank`, restricted to
        `crowd_text.topics` when set) and the agents' persona embeddings (`self.agent_interest`).
        """
        t = c.get("crowd_text", None) or {}
        corpus = text_bank.load_corpus(t.get("path", "") or None)
        self.topics = corpus.topics
        tok, L = self.tokenizer, self.social_params.content_len
        if self.code:
            post_tok = text_bank.tokenize(tok, code_problems.TEXTS, L)
            post_topic = np.arange(len(code_problems.TEXTS))
        else:
            post_tok, post_topic = text_bank.tokenize(tok, corpus.posts, L), corpus.post_topic
        # One encoder pass per text (the costly part with a real model): pooled states of the
        # posts + comments [*, L] and of the descriptions + personas (one longer shape). The
        # centre is their mean over the post bank: subtracting it keeps embeddings spread over
        # directions (raw pooled states of an LLM share a large common component, which would
        # make every post look alike to the crowd).
        # With a checkpoint they are cached on disk (crowd_text.cache; key: the checkpoint's
        # files, dtype, tokens) so later runs of the same model skip the pass.
        pooled_jit = jax.jit(self._pooled)
        cache_key = cache_dir = None
        if c.model.checkpoint and t.get("cache", True):
            cache_key = repr(("pooled-v1", text_bank.files_key(c.model.checkpoint),
                              c.model.dtype, c.model.param_dtype))
            cache_dir = os.path.join(zoo.cache_dir(), "text_bank")
        pooled = lambda rows: text_bank.cached_rows(  # noqa: E731
            lambda r: text_bank.embed_rows(lambda x: pooled_jit(self._init_ref, x), r),
            rows, cache_key, cache_dir)
        com_tok = text_bank.tokenize(tok, corpus.comments, L)
        long_tok = text_bank.tokenize(tok, list(corpus.interests) + list(personas))
        short = pooled(np.concatenate([post_tok, com_tok]))
        self.embed_center = jnp.asarray(short[:len(post_tok)].mean(0))
        project = lambda h: np.asarray(self._project(jnp.asarray(h)))  # noqa: E731
        short_emb, long_emb = project(short), project(pooled(long_tok))
        post_emb, com_emb = short_emb[:len(post_tok)], short_emb[len(post_tok):]
        nd = len(corpus.interests)
        keep = set(text_bank.topic_ids(corpus, t.get("topics", ()) or corpus.topics))
        desc = [i for i, k in enumerate(corpus.interest_topic) if k in keep]
        self.crowd_text = text_bank.CrowdText(
            posts=text_bank.make_bank(post_tok, post_emb, post_topic),
            comments=text_bank.make_bank(com_tok, com_emb, corpus.comment_topic),
            temperature=jnp.float32(t.get("temperature", 0.05)), by_id=bool(self.code))
        self.interest_bank = text_bank.make_bank(
            long_tok[desc], long_emb[desc], [corpus.interest_topic[i] for i in desc])
        self.agent_interest = jnp.asarray(long_emb[nd:])
        # For the agents' topic metrics: the crowd's interest centre (its users draw the kept
        # descriptions uniformly) and each topic's centroid over all descriptions.
        self.crowd_center = np.asarray(normalize(self.interest_bank.embedding.mean(0)))
        self.topic_centroids = np.asarray(text_bank.topic_centroids(text_bank.make_bank(
            long_tok[:nd], long_emb[:nd], corpus.interest_topic), len(corpus.topics)))

    def _rl_config(self, c):
        """PPOConfig / GRPOConfig from `c.rl`: every dataclass field under its own name
        (`rl_common.from_run_config`; unknown keys are one error naming them). Sampling comes
        from c.rollout and the tokenizer, PPO's reward_norm from c.reward.normalize."""
        group = int(c.rl.get("group_size", 0) or 0)
        if c.rl.algo == "grpo":
            # Default group = the agents acting in the same tick (a tick-level baseline): the
            # society applies one answer per agent, so there are no repeated samples of one
            # prompt. A smaller group must split the tick's rows evenly.
            group = group or self.active
            if self.active % group:
                raise ValueError(f"rl.group_size={group} must divide the agents acting per tick "
                                 f"({self.active}): a group never spans two ticks")
        return rl_common.from_run_config(
            c.rl, loop_keys=("value_mode", "lora_rank", "lora_alpha"),
            stop_token_ids=self.stop_ids, temperature=float(c.rollout.temperature),
            top_k=int(c.rollout.top_k), top_p=float(c.rollout.top_p), group_size=group,
            # running reward std: kept in TrainState.reward_stats
            reward_norm="running" if c.reward.normalize == "running" else "none")

    def memory_estimate(self) -> memory.MemoryEstimate:
        """`memory.estimate` of this run's epoch: B = agents acting per tick in the rollout,
        ticks x B trajectories scored and trained, the update's minibatch and micro-batch."""
        c = self.config
        rows = int(c.rollout.ticks_per_epoch) * self.active
        minibatch = rows // max(1, int(c.rl.minibatches))
        micro = self.rl_config.accumulation(rows)[1]
        return memory.estimate(
            self.model_config, tuple(self.mesh.shape.values()), batch=self.active,
            prompt_len=self.template.max_len, response_len=self.sampling.max_new_tokens,
            train_micro_batch=micro, lora_rank=int(c.rl.lora_rank),
            remat=self.model_config.remat, trajectories=rows, minibatch_rows=minibatch,
            score_micro_batch=int(self.rl_config.micro_batch or 0),
            score_sharded=True, attention_chunk=int(self.model_config.attention_chunk),
            donate=self.fused)

    def _check_memory(self, c) -> None:
        """Warn before a run that cannot fit (when the backend reports device memory)."""
        device_bytes = memory.device_memory_bytes()
        if device_bytes is None:
            return
        memory.check_fits(self.memory_estimate(), device_bytes)

    def init_state(self) -> RunState:
        """Fresh run: initial policy (= reference), society reset, keys from config.seed."""
        key = jax.random.key(int(self.config.seed))
        k_train, k_soc, k_loop = jax.random.split(key, 3)
        # Fresh buffers throughout: the one-program epoch donates the state, so nothing in it
        # may share a buffer with what the run keeps (initial weights, text banks).
        copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731
        train = optim.init_train_state(self.rl_config, self.pdef, copy(self._init_params),
                                       copy(self._init_ref), k_train)
        soc = copy(society.reset(k_soc, self.social_params, self.crowd_text, self.interest_bank,
                                 self.agent_interest))
        return self.place(RunState(train=train, society=soc, key=jax.random.key_data(k_loop),
                                   epoch=jnp.zeros((), jnp.int32)))

    def place(self, state: RunState) -> RunState:
        """Put a run state on the mesh: parameters by the logical-axis rules (via their model
        metadata), everything else replicated."""
        if self.mesh.size == 1:  # the same NamedShardings the compiled epoch returns
            return jax.device_put(state, self.state_shardings(state))
        return sharding.put_global(state, self.state_shardings(state))

    def state_shardings(self, state: RunState):
        """Shardings of a RunState: the train state's weights and their Adam moments by the
        logical-axis rules (`sharding.train_state_shardings`), the society's per-user arrays
        along `agents` (`sharding.society_shardings`), the rest replicated."""
        mesh = self.mesh
        if getattr(self, "_weight_sh", None) is None:
            _, model_state = nnx.split(nnx.eval_shape(lambda: llama.Llama(
                self.model_config, rngs=nnx.Rngs(0))))
            self._weight_sh = nnx.to_pure_dict(sharding.state_shardings(model_state, mesh))
        rep = sharding.replicated(mesh)
        tx, _ = optim.make_optimizer(self.rl_config)
        train = sharding.train_state_shardings(state.train, self._weight_sh, mesh, tx,
                                               lora=self.pdef.lora is not None)
        return RunState(train=train,
                        society=sharding.society_shardings(state.society, mesh),
                        key=rep, epoch=rep)

    # ------------------------------------------------------------------------------------------
    # compiled pieces

    def _pooled(self, ref_params, content: Array) -> Array:
        """Mean of the reference model's final hidden states over the content tokens [B, H]."""
        mask = content >= 0  # right-padded with PAD_TOKEN: padding never attended
        out = nnx.merge(self.pdef.graphdef, ref_params).forward(jnp.maximum(content, 0), mask)
        m = mask[..., None].astype(jnp.float32)
        return (out.hidden.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1.0)

    def _embed(self, ref_params, content: Array) -> Array:
        """Frozen encoder: content [B, L] -> unit embeddings [B, d]:
        normalize((pooled reference hidden - centre) @ fixed random projection)."""
        return self._project(self._pooled(ref_params, content))

    def _project(self, pooled: Array) -> Array:
        """Pooled states [B, H] -> unit embeddings [B, d] (centre, project, normalize)."""
        z = (pooled - self.embed_center) @ self.projection
        return z / jnp.maximum(jnp.linalg.norm(z, axis=-1, keepdims=True), 1e-6)

    def _counters(self, soc: SocialState) -> Array:
        p = soc.posts
        return jnp.stack([p.likes, p.reposts, p.comments], axis=-1)

    def _record(self, before: SocialState, after: SocialState):
        """Engagement gained during the tick per slot (a new post in a slot starts from 0)."""
        same = (after.posts.id == before.posts.id)[:, None]
        c_after, c_before = self._counters(after), self._counters(before)
        deltas = jnp.where(same, c_after - c_before, c_after)
        a = self.num_agents
        followers = after.users.num_followers[:a] - before.users.num_followers[:a]
        crowd_posts = jnp.sum((after.posts.id != before.posts.id) & (after.posts.author >= a))
        return deltas, after.posts.id, followers, crowd_posts

    def _rows_on_data_axes(self, tree):
        """Inside jit: constrain every leaf's leading (row) dim to the data axes, where they
        divide it (`sharding.tree_data_shardings`); a no-op on one device."""
        if self.mesh.size == 1:
            return tree
        return jax.lax.with_sharding_constraint(
            tree, sharding.tree_data_shardings(tree, self.mesh))

    def _rollout_fn(self, params, ref_params, soc: SocialState, key: Array, grammar=None):
        a = self.num_agents
        weights = policy_lib.policy_weights(self.pdef, params, ref_params)
        graphdef = self.pdef.graphdef

        def agent_tick(carry, _):
            soc, key = carry
            key, k_act, k_feed, k_gen, k_step = jax.random.split(key, 5)
            if self.activation is not None:  # by the hour's activity (OASIS's profiles)
                hour = activation.hour_of_tick(soc.tick, self.social_params)
                agents = activation.sample_active(
                    k_act, jnp.asarray(self.activation)[:, hour], self.active)
            elif self.active < a:  # a uniform random subset acts this tick
                agents = jnp.sort(jax.random.permutation(k_act, a)[:self.active]).astype(jnp.int32)
            else:
                agents = jnp.arange(a, dtype=jnp.int32)
            soc, feed = society.observe(k_feed, soc, agents, self.social_params)
            feed_authors = jnp.where(feed.valid, soc.posts.author[feed.slots], -1)
            view = prompting.feed_view(soc.posts, feed.slots, feed.valid,
                                       self.social_params.feed_comments or None)
            ids, mask = prompting.assemble(self.template, agents, view)
            ids, mask = self._rows_on_data_axes((ids, mask))  # each device: its agents
            out = generate_from_state(graphdef, weights, ids, mask, k_gen,
                                                   self.sampling, grammar)
            if self.tool_call:
                parsed, failure = agent_actions.parse_tool_call(
                    self.tools, out.tokens, out.mask, self.social_params.content_len)
            else:
                parsed = agent_actions.parse(self.vocab, out.tokens, out.mask,
                                             self.social_params.content_len)
                failure = jnp.where(parsed.parsed, agent_actions.FAIL_OK,
                                    agent_actions.FAIL_NO_JSON).astype(jnp.int32)
            emb = self._embed(ref_params, parsed.content)
            acts = agent_actions.to_actions(parsed, agents, feed.ids, feed.valid,
                                            feed_authors, emb, view.comment_ids)
            before = soc
            soc, info = society.step(k_step, soc, acts, self.social_params)
            rec = self._record(before, soc)
            ys = dict(agent=agents, prompt_ids=ids, prompt_mask=mask, tokens=out.tokens,
                      logprobs=out.logprobs, mask=out.mask, action_type=parsed.type,
                      parsed=parsed.parsed, failure=failure, reason=info.agent.reason,
                      created_id=info.agent.created_id, tick=info.tick, target=acts.target,
                      embedding=emb,
                      target_author=jnp.where(parsed.feed_pos >= 0, jnp.take_along_axis(
                          feed_authors, jnp.maximum(parsed.feed_pos, 0)[:, None], 1)[:, 0], -1))
            return (soc, key), (ys, rec)

        def settle_tick(carry, _):
            soc, key = carry
            key, k_step = jax.random.split(key)
            before = soc
            soc, _ = society.step(k_step, soc, None, self.social_params)
            return (soc, key), self._record(before, soc)

        (soc, key), (ys, rec) = jax.lax.scan(agent_tick, (soc, key), None,
                                              length=int(self.config.rollout.ticks_per_epoch))
        settle = int(self.config.reward.horizon) - 1 if self.config.reward.settle else 0
        if settle > 0:
            (soc, key), rec_s = jax.lax.scan(settle_tick, (soc, key), None, length=settle)
            rec = jax.tree.map(lambda x, y: jnp.concatenate([x, y]), rec, rec_s)
        deltas, slot_ids, follower_delta, crowd_posts = rec
        return soc, Rollout(**ys, deltas=deltas, slot_ids=slot_ids,
                            follower_delta=follower_delta, crowd_posts=crowd_posts)

    def scores(self, ro: Rollout) -> Tuple[Array, Array]:
        """Per-trajectory score [T, A] and per-post engagement [T, A, E] (0 where no post)."""
        t, a = ro.created_id.shape
        created = ro.created_id.reshape(-1)
        created_tick = jnp.repeat(ro.tick, a)
        eng = rewards_lib.engagement_within_horizon(created, created_tick, ro.deltas,
                                                    ro.slot_ids, int(self.config.reward.horizon),
                                                    first_tick=ro.tick[0])
        r = self.config.reward
        w = jnp.asarray([r.like, r.repost, r.comment], jnp.float32)
        score = eng @ w
        if r.new_followers:
            authors = ro.agent.reshape(-1)
            score += r.new_followers * rewards_lib.followers_within_horizon(
                authors, created_tick, ro.follower_delta, int(r.horizon), ro.tick[0],
                valid=created >= 0)
        made = created >= 0
        if r.get("non_post_baseline", False):
            # Actions that create nothing earn the epoch's mean post score: posting pays only
            # when the post beats the average (quality, not volume).
            base = jnp.sum(jnp.where(made, score, 0.0)) / jnp.maximum(jnp.sum(made), 1)
        else:
            base = float(r.non_post)
        score = jnp.where(made, score, base)
        return score.reshape(t, a), eng.reshape(t, a, -1)

    def code_bonus(self, ro: Rollout) -> np.ndarray:
        """Host side: [T, A] bonus for comments whose code passes the commented problem's tests.
        A problem post is one whose text came from the problem bank (seed/crowd authors)."""
        bonus = np.zeros(ro.created_id.shape, np.float32)
        if not self.code:
            return bonus
        types, ok = np.asarray(ro.action_type), np.asarray(ro.created_id) >= 0
        target, author = np.asarray(ro.target), np.asarray(ro.target_author)
        answer = ok & (types == int(ActionType.CREATE_COMMENT)) & (author >= self.num_agents)
        idx = np.argwhere(answer)
        if not len(idx):
            return bonus
        toks, mask = np.asarray(ro.tokens), np.asarray(ro.mask)
        texts = [self.tokenizer.decode(toks[t, a][mask[t, a]], skip_special_tokens=True)
                 .split(":", 1)[-1] for t, a in idx]
        problems = [int(target[t, a]) % len(code_problems.PROBLEMS) for t, a in idx]
        c = self.config.code
        passed = code_problems.verify(texts, problems, float(c.timeout_s), int(c.memory_mb))
        bonus[tuple(idx.T)] = np.where(passed, float(c.bonus), 0.0)
        return bonus

    def _score_fn(self, train: TrainState, ro: Rollout, bonus: Array, grammar=None):
        score, eng = self.scores(ro)
        score = score + bonus
        score_n = rewards_lib.normalize_scores(score.reshape(-1), self.config.reward.normalize)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        batch = buffer_lib.make_trajectory(
            flat(ro.prompt_ids), flat(ro.prompt_mask), flat(ro.tokens), flat(ro.mask),
            scores=score_n)
        if grammar is not None:
            # FSM states [B, N] int32, never [B, N, V] masks: the loss rebuilds each chunk's
            # allowed set from the grammar tables.
            batch = batch.replace(fsm_states=grammar_lib.step_states(
                grammar, batch.response_tokens, batch.response_mask))
        batch = self._rows_on_data_axes(batch)  # each device scores its share of the rows
        lp, ref, values = policy_lib.score_batch(self.pdef, train.params, train.ref_params, batch,
                                                 self.rl_config, grammar)
        batch = batch.replace(old_logprobs=lp, ref_logprobs=ref, values=values)
        # How far the rollout's own log-probs are from the re-scored ones (should be ~0).
        logprob_gap = jnp.max(jnp.abs(jnp.where(batch.response_mask,
                                                lp - flat(ro.logprobs), 0.0)))
        return batch, score, eng, logprob_gap

    # ------------------------------------------------------------------------------------------
    # one epoch

    def run_epoch(self, state: RunState) -> Tuple[RunState, Dict[str, Any], List[dict]]:
        """Rollout + reward + update. Returns (new state, metrics dict, text samples).

        One compiled program (`_epoch_fn`, state donated, shardings pinned) when no reward
        is computed on the host; otherwise three (rollout, host bonus, scoring, update)."""
        if self.fused:
            return self._run_fused(state)
        t0 = time.perf_counter()
        key = jax.random.wrap_key_data(state.key)
        key, k_roll = jax.random.split(key)
        soc, ro = self._rollout(state.train.params, state.train.ref_params, state.society, k_roll)
        jax.block_until_ready(ro.tokens)
        t_roll = time.perf_counter() - t0
        # The whole rollout comes to the host only for the host-side code bonus.
        bonus = (self.code_bonus(sharding.to_host(ro)) if self.code
                 else np.zeros(ro.created_id.shape, np.float32))
        batch, score, eng, gap = self._score(state.train, ro, jnp.asarray(bonus))
        # Trajectories along the data axes (rows that don't divide stay replicated).
        batch = sharding.put_global(batch, sharding.tree_data_shardings(batch, self.mesh))
        train, upd = self.update(state.train, batch)
        jax.block_until_ready(train.step)
        wall = time.perf_counter() - t0
        new = RunState(train=train, society=soc, key=jax.random.key_data(key),
                       epoch=state.epoch + 1)
        view, upd = sharding.to_host((self._view(ro, score, eng, gap), upd))
        metrics = self._metrics(view, upd, wall, t_roll)
        metrics["epoch"] = int(sharding.to_host(new.epoch))
        if self.code:
            metrics["code_passed"] = int((bonus > 0).sum())
        return self.place(new), metrics, self._samples(view, metrics["epoch"])

    def _epoch_fn(self, state: RunState, grammar=None):
        """The whole epoch as one program: rollout, scores, scoring pass, update, and the
        metrics' view. Same keys and steps as the three-program path of `run_epoch`."""
        self.epoch_trace_count += 1
        key = jax.random.wrap_key_data(state.key)
        key, k_roll = jax.random.split(key)
        soc, ro = self._rollout_fn(state.train.params, state.train.ref_params, state.society,
                                   k_roll, grammar=grammar)
        no_bonus = jnp.zeros(ro.created_id.shape, jnp.float32)
        batch, score, eng, gap = self._score_fn(state.train, ro, no_bonus, grammar=grammar)
        batch = self._rows_on_data_axes(batch)  # as run_epoch's put_global: the scored fields too
        train, upd = self.update.fn(state.train, batch, grammar)
        new = RunState(train=train, society=soc, key=jax.random.key_data(key),
                       epoch=state.epoch + 1)
        return new, upd, self._view_fn(ro, score, eng, gap)

    def epoch_program(self, state: RunState):
        """The jitted one-program epoch `f(state, grammar) -> (state, update metrics,
        EpochView)`: state shardings pinned (those of `state`, as `place` gives them) and the
        state donated. The grammar is a replicated argument, never a baked constant."""
        if self._epoch is None:
            sh = self.state_shardings(state)
            rep = sharding.replicated(self.mesh)
            self._epoch = jax.jit(self._epoch_fn, donate_argnums=0, in_shardings=(sh, rep),
                                  out_shardings=(sh, rep, rep))
        return self._epoch

    def _run_fused(self, state: RunState):
        epoch = self.epoch_program(state)
        t0 = time.perf_counter()
        new, upd, view = epoch(state, self.grammar)
        jax.block_until_ready(new.train.step)
        wall = time.perf_counter() - t0
        view, upd = sharding.to_host((view, upd))
        metrics = self._metrics(view, upd, wall, wall)
        metrics["epoch"] = int(sharding.to_host(new.epoch))
        return new, metrics, self._samples(view, metrics["epoch"])

    def _view_fn(self, ro: Rollout, score: Array, eng: Array, gap: Array) -> EpochView:
        """Reduce the epoch to what `_metrics` and `_samples` read (on the device)."""
        t, b = ro.created_id.shape
        created = ro.created_id >= 0
        is_post = created & ((ro.action_type == int(ActionType.CREATE_POST))
                             | (ro.action_type == int(ActionType.QUOTE_POST)))
        k = min(int(self.config.train.get("text_metrics_posts", 4096)), t * b)
        (idx,) = jnp.nonzero(is_post.reshape(-1), size=k, fill_value=-1)
        safe = jnp.maximum(idx, 0)
        keep = (idx >= 0)[:, None]
        flat = lambda x: x.reshape((t * b,) + x.shape[2:])[safe]  # noqa: E731
        return EpochView(
            agent=ro.agent, action_type=ro.action_type, parsed=ro.parsed, failure=ro.failure,
            reason=ro.reason,
            created=created, score=score, engagement=eng.astype(jnp.float32),
            tokens=jnp.sum(ro.mask).astype(jnp.float32), crowd_posts=jnp.sum(ro.crowd_posts),
            post_index=idx.astype(jnp.int32), post_tokens=jnp.where(keep, flat(ro.tokens), 0),
            post_mask=keep & flat(ro.mask), post_embedding=jnp.where(keep, flat(ro.embedding), 0),
            last_tokens=ro.tokens[-1], last_mask=ro.mask[-1], logprob_gap=gap)

    def _metrics(self, v: EpochView, upd, wall, t_roll) -> Dict[str, Any]:
        created = np.asarray(v.created)
        types = np.asarray(v.action_type)
        is_post = created & np.isin(types, [int(ActionType.CREATE_POST),
                                            int(ActionType.QUOTE_POST)])
        eng = np.asarray(v.engagement)
        likes = eng[..., 0][is_post]
        engaged = eng.sum(-1)[is_post] > 0
        n_posts = int(is_post.sum())
        names = {int(t): t.name.lower() for t in ActionType}
        mix = {names[k]: int((types == k).sum()) for k in np.unique(types)}
        sc = np.asarray(v.score)
        reason, parsed = np.asarray(v.reason), np.asarray(v.parsed)
        m = {
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
                                           in enumerate(agent_actions.FAILURE_KINDS) if i}}
               if self.tool_call else {}),
            "invalid_actions": int(((reason != 0) & parsed).sum()),
            "reward_mean": float(sc.mean()),
            "reward_std": float(sc.std()),
            "action_mix": mix,
            "crowd_posts": int(v.crowd_posts),
            "likes_hist": np.bincount(likes.astype(int), minlength=1).tolist() if n_posts else [],
            "logprob_gap": float(v.logprob_gap),
            # fused_epoch: one program, so rollout_s / tokens_per_s / ticks_per_s cover the
            # whole epoch (rollout, scoring and update)
            "fused_epoch": bool(self.fused),
            "tokens_per_s": float(v.tokens) / max(t_roll, 1e-9),
            "ticks_per_s": types.shape[0] / max(t_roll, 1e-9),
            "rollout_s": t_roll,
            "wall_s": wall,
            "ppo": {k: float(x) for k, x in upd.items()},
        }
        # Text metrics over the first K posts of the epoch, in tick order (all of them when
        # the epoch has at most train.text_metrics_posts posts).
        idx = np.asarray(v.post_index)
        kept = idx >= 0
        idx = idx[kept]
        m.update(self._topic_metrics(np.asarray(v.post_embedding)[kept]))
        # Text drift of the epoch's posts (decoded on the host, action prefix "post:" /
        # "quote <n>:" cut) and the 3 most-liked posts (ties: earliest first) for summary.md.
        toks, tmask = np.asarray(v.post_tokens)[kept], np.asarray(v.post_mask)[kept]
        texts = [self.tokenizer.decode(toks[i][tmask[i]], skip_special_tokens=True)
                 for i in range(len(idx))]
        if self.tool_call:  # the call's text argument (the host-side reference parser)
            c = self.config
            sp = self.social_params
            texts = [agent_actions.parse_tool_call_text(
                t, c.agents.actions, sp.feed_size, sp.feed_comments)[3] or "" for t in texts]
        else:
            texts = [t.split(":", 1)[-1].strip() for t in texts]
        authors = [int(a) for a in np.asarray(v.agent).reshape(-1)[idx]]
        post_likes = eng[..., 0].reshape(-1)[idx]
        m["drift"] = report.text_drift(texts, authors)
        top = sorted(range(len(texts)), key=lambda i: (-float(post_likes[i]), i))[:3]
        m["posts"] = [{"text": texts[i], "likes": int(post_likes[i]), "agent": authors[i]}
                      for i in top]
        if texts:  # the least-liked post (ties: earliest), for the end-of-run console story
            low = min(range(len(texts)), key=lambda i: (float(post_likes[i]), i))
            m["worst_post"] = {"text": texts[low], "likes": int(post_likes[low]),
                               "agent": authors[low]}
        return m

    def _topic_metrics(self, emb: np.ndarray) -> Dict[str, Any]:
        """Where the agents' posts (embeddings [n, d]) sit among the crowd's topics:
        `crowd_interest_sim` = mean cosine to the crowd's interest centre; `topic_share` = share
        of posts nearest each topic's centroid (topic drift shows here)."""
        if not len(emb):
            return {"crowd_interest_sim": 0.0, "topic_share": {}}
        near = np.argmax(emb @ self.topic_centroids.T, axis=1)
        counts = np.bincount(near, minlength=len(self.topics)) / len(emb)
        return {"crowd_interest_sim": float((emb @ self.crowd_center).mean()),
                "topic_share": {self.topics[i]: float(c) for i, c in enumerate(counts) if c}}

    def _samples(self, v: EpochView, epoch: int, n: Optional[int] = None) -> List[dict]:
        n = int(self.config.train.log_samples) if n is None else n
        toks, mask = np.asarray(v.last_tokens), np.asarray(v.last_mask)
        sc, agent = np.asarray(v.score)[-1], np.asarray(v.agent)[-1]
        out = []
        for a in range(min(n, toks.shape[0])):
            out.append({"epoch": epoch, "agent": int(agent[a]),
                        "text": self.tokenizer.decode(toks[a][mask[a]], skip_special_tokens=True),
                        "score": float(sc[a])})
        return out

    def export_policy(self, state: RunState, path: str, write: bool = True,
                      initial: bool = False) -> None:
        """Write the current policy as a complete Hugging Face directory: weights, config.json,
        generation_config.json (eos = the run's stop ids) (`checkpoint_hf.save_pretrained`) and
        the tokenizer with its chat template, so `AutoTokenizer` / `AutoModelForCausalLM` and
        `launch/eval.py` load it as it is. initial: the run's initial policy instead (the
        frozen reference: the weights before any update). Multi-process: every process must
        call it (the weights are gathered); `write` only on one."""
        weights = (state.train.ref_params if initial else policy_lib.policy_weights(
            self.pdef, state.train.params, state.train.ref_params))
        host = sharding.to_host(weights)
        if write:
            model = nnx.merge(self.pdef.graphdef, host)
            model.config = model.config.replace(eos_token_id=tuple(self.stop_ids))
            checkpoint_hf.save_pretrained(model, path)
            self.tokenizer.save_pretrained(path)
