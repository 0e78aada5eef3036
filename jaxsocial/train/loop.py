"""One Social-RL run: host-side set-up and the epoch driver.

    run = SocialRL(config)                 # host-side set-up: model, tokenizer, society, PPO
    state = run.init_state()               # RunState: train state, society, key, epoch
    state, metrics, samples = run.run_epoch(state)

The epoch itself is pure functions built once from this set-up (`train.epoch.make_epoch`,
`run.fns`): a rollout in the society (one `lax.scan` over ticks: feeds, prompts, generation,
parsed actions, society steps, then crowd-only settle ticks), the social reward (engagement a
post earned within `reward.horizon`), the scoring pass and the PPO / GRPO update. They compile
into one donated program per epoch, or three (rollout, scoring, update) when a reward is
computed on the host (the code bonus). The reference model stays the initial policy. This
module keeps what runs on the host: set-up, the memory check, placement on the mesh, the code
bonus, metrics, samples and export.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from jaxsocial import models
from jaxsocial.agents import actions, prompting, tool_calls
from jaxsocial.generation.generate import generate_from_state
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import checkpoint_hf, llama, zoo
from jaxsocial.rl import grpo as grpo_lib
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl import optim
from jaxsocial.rl import policy as policy_lib
from jaxsocial.rl import ppo as ppo_lib
from jaxsocial.social import activation, cascades, polarisation, society, text_bank
from jaxsocial.social.actions import ActionType
from jaxsocial.social.state import normalize
from jaxsocial.train import (
    checks,
    code_problems,
    memory,
    report,
    sharding,
    society_encoder,
)
from jaxsocial.train import config as run_config
from jaxsocial.train import epoch as epoch_lib
from jaxsocial.train.epoch import EpochView, Rollout, RunState, make_epoch

__all__ = ["EpochView", "Rollout", "RunState", "SocialRL"]

Array = jax.Array


def _load(config):
    """-> (model, tokenizer, stop_ids) through the one loader (`models.load`): the checkpoint,
    or a random `model.preset` with `config.tokenizer` (default: the tiny tokenizer)."""
    m = config.model  # model.require_checkpoint is checked by checks.check
    return models.load(m.checkpoint or m.preset, dtype=m.dtype, param_dtype=m.param_dtype,
                       tokenizer=config.tokenizer or None, seed=int(config.seed),
                       **run_config.model_switches(m))


@functools.partial(jax.jit, static_argnums=(0, 1, 3))
def _interview_answers(pdef, social_params, template, sampling, params, ref_params, soc, key):
    """GenerationOutput of every agent's greedy answer to the prompt `template` over the feed
    it would see in `soc` now (`society.feed`: pure, nothing marked seen)."""
    agents = jnp.arange(social_params.num_agents, dtype=jnp.int32)
    feed = society.feed(key, soc, agents, social_params)
    view = prompting.feed_view(soc.posts, feed.slots, feed.valid,
                               social_params.feed_comments or None)
    ids, mask = prompting.assemble(template, agents, view)
    weights = policy_lib.policy_weights(pdef, params, ref_params)
    return generate_from_state(pdef.graphdef, weights, ids, mask, key, sampling)


class _BindFrozen:
    """A jitted function called with frozen inputs bound as keywords (the grammar, the society
    encoder's weights): `f(*args)` / `f.lower(*args)` pass them as traced arguments of the
    compiled program (never baked constants)."""

    def __init__(self, jitted, **frozen):
        self.jitted, self.frozen = jitted, frozen

    def __call__(self, *args):
        return self.jitted(*args, **self.frozen)

    def lower(self, *args):
        return self.jitted.lower(*args, **self.frozen)


class SocialRL:
    """Host-side set-up of one Social-RL run, and its compiled epoch pieces."""

    def __init__(self, config: ml_collections.ConfigDict, mesh=None):
        self.config = config
        checks.check(config)  # before anything is built or compiled
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
        self.activation = activation.from_config(
            c.agents.get("activation", None), a, int(c.seed), active_per_tick=active,
            hours=activation.hours_of_run(c))
        horizon = int(c.reward.horizon)
        if horizon < 1:
            raise ValueError(f"reward.horizon must be >= 1, got {horizon}")
        # The society's knobs (SocialParams), not to be confused with the policy's params.
        self.social_params = society.make_params(**run_config.society_fields(c), num_agents=a,
                                                 reward_horizon=horizon)
        if self.social_params.num_users < a:
            raise ValueError(f"society.num_users={self.social_params.num_users} < "
                             f"agents.num_agents={a}")
        personas = [c.agents.personas[i % len(c.agents.personas)] for i in range(a)]
        # tool_call: the tools, their arguments and one example call (or agents.tool_instruction)
        instruction, footer = run_config.prompt_text(c, lambda: tool_calls.tool_instruction(
            c.agents.actions, self.social_params.feed_size))
        self.personas = personas
        self.template = self.prompt_template(instruction, footer)
        self.vocab = actions.ActionVocab.build(self.tokenizer, c.agents.actions,
                                               self.social_params.feed_size, self.stop_ids,
                                               self.social_params.feed_comments)
        self.tools = (tool_calls.ToolVocab.build(
            self.tokenizer, c.agents.actions, self.social_params.feed_size, model.config.vocab_size,
            self.social_params.feed_comments) if self.tool_call else None)
        n_new = int(c.rollout.max_new_tokens)
        longest_prefix = int(np.max(np.asarray(self.vocab.prefix_len)))
        max_text = min(self.social_params.content_len, n_new - longest_prefix - 1)
        if max_text < 1:
            raise ValueError(f"rollout.max_new_tokens={n_new} leaves no room for text after the "
                             f"longest action prefix ({longest_prefix} tokens) and a stop token")
        if self.tool_call:
            tool_calls.check_tool_call_room(self.tokenizer, c.agents.actions,
                                            self.social_params.feed_size, n_new)
        # Free text excludes special tokens only (id 0 is a real token, e.g. "!" in Llama-3).
        specials = sorted(set(self.tokenizer.added_tokens_decoder))
        self.grammar = (self.vocab.grammar(model.config.vocab_size, max_text, specials)
                        if c.agents.action_mode == "constrained" else None)
        self.sampling = SamplingConfig(
            max_new_tokens=n_new, temperature=run_config.temperature(c),
            top_k=int(c.rollout.top_k), top_p=float(c.rollout.top_p),
            stop_token_ids=self.stop_ids, prompt_bucket=self.template.max_len,
            decode_buckets=int(c.rollout.get("decode_buckets", 1)))
        self.rl_config = self._rl_config(c)
        lora = None
        if int(c.rl.lora_rank) > 0:
            lora = lora_lib.LoraConfig(rank=int(c.rl.lora_rank), alpha=float(c.rl.lora_alpha))
        pdef, params, ref = policy_lib.init_policy(
            model, jax.random.key(int(c.seed) + 1), lora=lora,
            value_mode="none" if c.rl.algo == "grpo" else c.rl.value_mode)
        self.pdef = pdef
        self._init_params, self._init_ref = params, ref
        self.old_logprobs = policy_lib.old_logprobs_source(pdef, self.rl_config, True)
        self.old_values = policy_lib.old_values_source(pdef, self.rl_config, self.old_logprobs)
        make = grpo_lib.make_update if c.rl.algo == "grpo" else ppo_lib.make_update
        self.update = make(self.rl_config, pdef, grammar=self.grammar)
        # The society's frozen encoder (train.society_encoder): the sentence encoder, or the
        # reference's hidden states, mean-pooled, through a fixed random projection.
        self.encoder_kind = c.society.get("encoder", "reference")  # checked by checks.check
        self.encoder_graphdef = self.encoder_params = self.retokenizer = None
        self.embed_center = self.projection = None
        if self.encoder_kind == "minilm":
            self.encoder_graphdef, self.encoder_params, self.retokenizer = (
                society_encoder.load_minilm(self.tokenizer))
        else:
            h, d = model.config.hidden_size, self.social_params.embed_dim
            self.projection = (jax.random.normal(jax.random.key(int(c.seed) + 7919), (h, d))
                               / np.sqrt(h))
        self.code = c.code.enabled
        # One compiled program per epoch unless a reward is computed on the host (code bonus).
        self.fused = bool(c.train.get("fused_epoch", True)) and not self.code
        self._build_text(c, personas)
        self._check_memory(c)
        # The grammar enters each compiled program as an argument: closed over, XLA would bake
        # its [S, V] tables in as constants (and spend minutes constant-folding them).
        self.fns = make_epoch(self)  # the epoch's pure functions (train.epoch)
        self._rollout = _BindFrozen(jax.jit(self.fns.rollout), grammar=self.grammar,
                                    encoder=self.encoder_params)
        self._score = _BindFrozen(jax.jit(self.fns.score_batch), grammar=self.grammar)
        self._view = jax.jit(self.fns.view)
        self._cascades = jax.jit(cascades.cascades)
        self._polarisation = jax.jit(functools.partial(polarisation.summary,
                                                       params=self.social_params))
        self._epoch = None  # built at the first epoch, with the state's shardings pinned
        self.epoch_trace_count = 0

    # ------------------------------------------------------------------------------------------
    # set-up

    def prompt_template(self, instruction: str, footer: str) -> prompting.PromptTemplate:
        """The agents' prompt (their personas and feed) with this instruction and footer."""
        c, sp = self.config, self.social_params
        a = self.num_agents
        return prompting.PromptTemplate.build(
            self.tokenizer, self.personas, instruction, footer, sp.feed_size, sp.content_len,
            names=[c.agents.names[i % len(c.agents.names)] for i in range(a)]
            if c.agents.names else None, newest_comment=bool(c.agents.newest_comment),
            num_users=sp.num_users, feed_comments=sp.feed_comments)

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
        # One encoder pass per text: posts + comments [*, L] and descriptions + personas (one
        # longer shape).
        com_tok = text_bank.tokenize(tok, corpus.comments, L)
        long_tok = text_bank.tokenize(tok, list(corpus.interests) + list(personas))
        if self.encoder_kind == "minilm":
            # The rollout's own path: policy tokens -> text -> the encoder's tokens -> embedding.
            embed_jit = jax.jit(functools.partial(
                society_encoder.minilm_embed, self.encoder_graphdef, self.retokenizer))
            embed = lambda rows: text_bank.embed_rows(  # noqa: E731
                lambda x: embed_jit(self.encoder_params, x), rows)
            short_emb = embed(np.concatenate([post_tok, com_tok]))
            long_emb = embed(long_tok)
        else:
            short_emb, long_emb = self._reference_embeddings(c, t, post_tok, com_tok, long_tok)
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

    def _reference_embeddings(self, c, t, post_tok, com_tok, long_tok):
        """`society.encoder="reference"`: the text banks' embeddings through the reference
        policy's pooled states (sets the centre the rollout subtracts too)."""
        # The costly pass with a real model. The centre is the mean over the post bank:
        # subtracting it keeps embeddings spread over directions (raw pooled states of an LLM
        # share a large common component, which would make every post look alike to the crowd).
        # With a checkpoint they are cached on disk (crowd_text.cache; key: the checkpoint's
        # files, dtype, tokens) so later runs of the same model skip the pass.
        pooled_jit = jax.jit(functools.partial(epoch_lib.pooled_states, self.pdef.graphdef))
        cache_key = cache_dir = None
        if c.model.checkpoint and t.get("cache", True):
            cache_key = repr(("pooled-v1", text_bank.files_key(c.model.checkpoint),
                              c.model.dtype, c.model.param_dtype))
            cache_dir = os.path.join(zoo.cache_dir(), "text_bank")
        pooled = lambda rows: text_bank.cached_rows(  # noqa: E731
            lambda r: text_bank.embed_rows(lambda x: pooled_jit(self._init_ref, x), r),
            rows, cache_key, cache_dir)
        short = pooled(np.concatenate([post_tok, com_tok]))
        self.embed_center = jnp.asarray(short[:len(post_tok)].mean(0))
        project = lambda h: np.asarray(epoch_lib.project(  # noqa: E731
            jnp.asarray(h), self.embed_center, self.projection))
        return project(short), project(pooled(long_tok))

    def _rl_config(self, c):
        """PPOConfig / GRPOConfig of the run (`run_config.rl_config`) with the tokenizer's stop
        ids; a GRPO group must split the agents acting in one tick evenly."""
        cfg = run_config.rl_config(c, self.active).replace(stop_token_ids=self.stop_ids)
        if c.rl.algo == "grpo" and self.active % cfg.group_size:
            raise ValueError(f"rl.group_size={cfg.group_size} must divide the agents acting per "
                             f"tick ({self.active}): a group never spans two ticks")
        return cfg

    def memory_estimate(self) -> memory.MemoryEstimate:
        """`memory.estimate` of this run's epoch: B = agents acting per tick in the rollout,
        ticks x B trajectories scored and trained, the update's minibatch and micro-batch."""
        c = self.config
        rows = int(c.rollout.ticks_per_epoch) * self.active
        minibatch = rows // max(1, int(c.rl.num_minibatches))
        micro = self.rl_config.accumulation(rows)[1]
        return memory.estimate(
            self.model_config, tuple(self.mesh.shape.values()), batch=self.active,
            prompt_len=self.template.max_len, response_len=self.sampling.max_new_tokens,
            train_micro_batch=micro, lora_rank=int(c.rl.lora_rank),
            remat=self.model_config.remat, trajectories=rows, minibatch_rows=minibatch,
            score_micro_batch=int(self.rl_config.micro_batch or 0),
            score_sharded=True, attention_chunk=int(self.model_config.attention_chunk),
            donate=self.fused, social_params=self.social_params,
            text_rows=self.crowd_text.posts.size + self.crowd_text.comments.size,
            grammar_bytes=memory.tree_bytes(self.grammar),
            scan_layers=bool(self.model_config.scan_layers))

    def _check_memory(self, c) -> None:
        """Refuse a run whose epoch cannot fit this machine, warn near the limit
        (`memory.check_machine`), on every backend: the per-device estimate against one
        device's memory (GPU/TPU) or, on the CPU, the RAM the mesh's local devices share. An
        abstract run (ShapeDtypeStruct weights: `train.aot`) allocates nothing: not checked."""
        leaves = jax.tree.leaves(self._init_params)
        if leaves and isinstance(leaves[0], jax.ShapeDtypeStruct):
            return
        m = c.model
        what = (f"model.checkpoint={m.checkpoint!r}" if m.checkpoint else
                f"model.preset={m.preset!r}") + f" on mesh.shape={tuple(self.mesh.shape.values())}"
        memory.check_machine(self.memory_estimate(), len(self.mesh.local_devices), what)

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
            return jax.device_put(state, self.run_state_shardings(state))
        return sharding.put_global(state, self.run_state_shardings(state))

    def run_state_shardings(self, state: RunState):
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
    # host-side reward

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
        metrics.update(self.society_metrics(new))
        if self.code:
            metrics["code_passed"] = int((bonus > 0).sum())
        return self.place(new), metrics, self._samples(view, metrics["epoch"])

    def _epoch_fn(self, state: RunState, grammar=None, encoder=None):
        """`fns.epoch`, counting its traces (one per compiled epoch shape)."""
        self.epoch_trace_count += 1
        return self.fns.epoch(state, grammar, encoder)

    def epoch_program(self, state: RunState):
        """The jitted one-program epoch `f(state, grammar, encoder) -> (state, update metrics,
        EpochView)`: state shardings pinned (those of `state`, as `place` gives them) and the
        state donated. The grammar and the society encoder's weights (`encoder_params`, None
        unless `society.encoder="minilm"`) are replicated arguments, never baked constants."""
        if self._epoch is None:
            sh = self.run_state_shardings(state)
            rep = sharding.replicated(self.mesh)
            self._epoch = jax.jit(self._epoch_fn, donate_argnums=0, in_shardings=(sh, rep, rep),
                                  out_shardings=(sh, rep, rep))
        return self._epoch

    def _run_fused(self, state: RunState):
        epoch = self.epoch_program(state)
        t0 = time.perf_counter()
        new, upd, view = epoch(state, self.grammar, self.encoder_params)
        jax.block_until_ready(new.train.step)
        wall = time.perf_counter() - t0
        view, upd = sharding.to_host((view, upd))
        metrics = self._metrics(view, upd, wall, wall)
        metrics["epoch"] = int(sharding.to_host(new.epoch))
        metrics.update(self.society_metrics(new))
        return new, metrics, self._samples(view, metrics["epoch"])

    def society_metrics(self, state: RunState) -> Dict[str, Any]:
        """The society at the end of the epoch: `cascades`, how far its alive original posts
        spread (`social.cascades`: size, depth, breadth and half time of their repost / quote
        trees, as percentiles), and `polarisation` of its follow graph
        (`social.polarisation.summary`; the shuffle's key is the seed folded with the epoch,
        apart from the run's own keys)."""
        soc = state.society
        epoch = int(sharding.to_host(state.epoch))
        key = jax.random.fold_in(jax.random.key(int(self.config.seed) + 104729), epoch)
        pol = sharding.to_host(self._polarisation(key, soc))
        return {"cascades": cascades.summary(sharding.to_host(self._cascades(soc.posts))),
                "polarisation": {k: int(v) if k == "follow_edges" else
                                 (None if np.isnan(v) else float(v)) for k, v in pol.items()}}

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
                                           in enumerate(tool_calls.FAILURE_KINDS) if i}}
               if self.tool_call else {}),
            "invalid_actions": int(((reason != 0) & parsed).sum()),
            "reward_mean": float(sc.mean()),
            "reward_std": float(sc.std()),
            "action_mix": mix,
            "crowd_posts": int(v.crowd_posts),
            "likes_hist": np.bincount(likes.astype(int), minlength=1).tolist() if n_posts else [],
            # rl.old_logprobs: "rollout" = the rollout's log-probs were the old log-probs
            # (nothing re-scored); "rescore" = re-scored, logprob_gap = max |rollout - rescored|
            "old_logprobs": self.old_logprobs,
            **({"logprob_gap": float(v.logprob_gap)} if self.old_logprobs == "rescore" else {}),
            # rl.old_values="rollout": the old values came from the rollout's hidden states
            **({"old_values": "rollout"} if self.old_values == "rollout" else {}),
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
            texts = [tool_calls.parse_tool_call_text(
                t, c.agents.actions, sp.feed_size, sp.feed_comments)[3] or "" for t in texts]
        else:
            texts = [t.split(":", 1)[-1].strip() for t in texts]
        authors = [int(a) for a in np.asarray(v.agent).reshape(-1)[idx]]
        post_likes = eng[..., 0].reshape(-1)[idx]
        # How close the agents' posts stay to their own persona (unit embeddings): a drift
        # towards the crowd's taste shows as this falling while crowd_interest_sim rises.
        persona = np.asarray(self.agent_interest)
        persona = persona / np.maximum(np.linalg.norm(persona, axis=-1, keepdims=True), 1e-12)
        emb = np.asarray(v.post_embedding)[kept]
        m["persona_sim"] = (float(np.mean(np.sum(emb * persona[authors], axis=-1)))
                            if len(authors) else 0.0)
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

    def interview(self, state: RunState, question: str, max_new_tokens: int = 48
                  ) -> List[dict]:
        """Every LLM agent answers `question` in its own context, outside the society: its
        persona and the feed the recommender would show it now, with the question in place of
        the action instruction; greedy decoding by the current policy. Nothing is posted,
        marked seen or rewarded, and `state` is not changed. Returns one
        {"epoch", "agent", "persona", "question", "answer"} per agent."""
        if not str(question).strip():
            raise ValueError("an interview question must be non-empty")
        template = self.prompt_template(str(question).strip(), "Your answer:")
        sampling = SamplingConfig(max_new_tokens=int(max_new_tokens), temperature=0.0,
                                  stop_token_ids=self.stop_ids, prompt_bucket=template.max_len)
        epoch = int(sharding.to_host(state.epoch))
        # The feed's exploration draws from its own key: the run's keys are not touched.
        key = jax.random.fold_in(jax.random.key(int(self.config.seed) + 15485863), epoch)
        out = _interview_answers(self.pdef, self.social_params, template, sampling,
                                 state.train.params, state.train.ref_params, state.society, key)
        toks, mask = sharding.to_host((out.tokens, out.mask))
        return [{"epoch": epoch, "agent": a, "persona": self.personas[a],
                 "question": str(question).strip(),
                 "answer": self.tokenizer.decode(toks[a][mask[a]],
                                                 skip_special_tokens=True).strip()}
                for a in range(self.num_agents)]

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
