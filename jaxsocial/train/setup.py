"""A run's set-up as data: everything the epoch is built from, then the weights apart.

    setup = build_setup(config)              # frozen: shapes, vocab, grammar, the update, ...
    weights = init_weights(config, setup)    # the policy, reference (and MiniLM) weights
    text = embed_text(setup, weights)        # the society's text banks in its embedding space
    state = init_state(setup, weights, text) # RunState on the mesh

`build_setup` reads no weights: the model's config comes from the preset or the checkpoint's
config.json / GGUF header, the policy's graph from `jax.eval_shape` of its initialiser. So an
abstract run (to compile a program for a memory check or another machine) is
`jax.eval_shape(functools.partial(init_weights, config, setup))` and `abstract_text(setup)`:
no weight is read, nothing is patched.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx, struct

from jaxsocial.agents import actions, prompting, tool_calls
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import llama, loading, zoo
from jaxsocial.rl import grpo as grpo_lib
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl import optim
from jaxsocial.rl import policy as policy_lib
from jaxsocial.rl import ppo as ppo_lib
from jaxsocial.social import activation, society, text_bank
from jaxsocial.social.state import SocialParams, normalize
from jaxsocial.train import checks, code_problems, embed_cache, sharding, society_encoder
from jaxsocial.train import cohorts as cohorts_lib
from jaxsocial.train import config as run_config

Array = jax.Array


@struct.dataclass
class RunState:
    """Everything a checkpoint holds: the RL train state, the society, the loop key, the epoch."""

    train: Any      # rl.state.TrainState
    society: Any    # social.state.SocialState
    key: Array      # uint32 [2] raw PRNG key data
    epoch: Array    # int32: epochs completed


@struct.dataclass
class Weights:
    """A run's initial weights: the trainable `params` ({"policy", "value"}), the frozen
    reference `ref` (the policy's initial weights) and the society's sentence encoder
    (`society.encoder="minilm"`; None otherwise)."""

    params: Any
    ref: Any
    encoder: Any = None


@struct.dataclass
class Text:
    """The society's text in its embedding space (`embed_text`; d = society.embed_dim).

    crowd_text: the crowd's post and comment banks; interest_bank: the crowd's interest
    descriptions (restricted to `crowd_text.topics`); agent_interest [A, d]: the LLM agents'
    persona embeddings; center [H] (`society.encoder="reference"`, else None): the mean pooled
    state of the post bank, which the encoder subtracts before projecting; crowd_center [d]
    and topic_centroids [K, d]: for the agents' topic metrics."""

    crowd_text: text_bank.CrowdText
    interest_bank: text_bank.TextBank
    agent_interest: Array
    crowd_center: Array
    topic_centroids: Array
    center: Optional[Array] = None


@dataclasses.dataclass(frozen=True, eq=False)
class TextTokens:
    """The society's texts, tokenized once on the host: post and comment banks [*, L], then
    the interest descriptions followed by the personas (one longer shape); `desc` the kept
    descriptions (`crowd_text.topics`)."""

    posts: np.ndarray
    post_topic: np.ndarray
    comments: np.ndarray
    comment_topic: np.ndarray
    long: np.ndarray
    interest_topic: Tuple[int, ...]
    desc: Tuple[int, ...]
    topics: Tuple[str, ...]
    temperature: float
    by_id: bool

    @property
    def descriptions(self) -> int:
        return len(self.interest_topic)


@dataclasses.dataclass(frozen=True, eq=False)
class EncoderDef:
    """The society's frozen encoder without weights (`society.encoder`): "reference" (the
    reference policy's pooled states through `projection` [H, d]) or "minilm" (the sentence
    encoder's graph and the policy-to-MiniLM `retokenizer`)."""

    kind: str
    projection: Optional[Array] = None
    graphdef: Any = None
    retokenizer: Any = None


@dataclasses.dataclass(frozen=True, eq=False)
class Setup:
    """Everything an epoch is built from, and no weight (`build_setup`)."""

    config: ml_collections.ConfigDict
    mesh: jax.sharding.Mesh
    model_config: llama.LlamaConfig
    tokenizer: Any
    stop_ids: Tuple[int, ...]
    num_agents: int               # A: LLM agents
    active: int                   # B: agents acting each tick
    activation: Optional[np.ndarray]  # [A, 24] activity weights over the clock, or None
    social_params: SocialParams
    personas: Tuple[str, ...]
    template: prompting.PromptTemplate
    vocab: actions.ActionVocab
    tools: Optional[tool_calls.ToolVocab]
    grammar: Any                  # the action grammar (constrained mode) or None
    sampling: SamplingConfig
    rl_config: Any                # rl.config.PPOConfig / GRPOConfig
    pdef: policy_lib.PolicyDef
    weight_shardings: dict        # the model weights' shardings on the mesh
    update: Any                   # the compiled PPO / GRPO update (`.fn`)
    old_logprobs: str             # "rollout" | "rescore" (`policy.old_logprobs_source`)
    old_values: str               # "rollout" | "rescore" | "none"
    encoder: EncoderDef
    text_tokens: TextTokens
    code: bool                    # code.enabled: the host-side code bonus
    fused: bool                   # one compiled program per epoch
    cohorts: Optional[cohorts_lib.Cohorts] = None  # agents.cohorts (None: one policy)

    @property
    def tool_call(self) -> bool:
        return self.config.agents.action_mode == "tool_call"

    @property
    def topics(self) -> Tuple[str, ...]:
        return self.text_tokens.topics


def build_setup(config: ml_collections.ConfigDict, mesh=None, *, checked: bool = False,
                model_config: Optional[llama.LlamaConfig] = None) -> Setup:
    """The frozen set-up of a run (no weight is read): the config checked (`checks.check`;
    checked=True: the caller has), the model's config and tokenizer, society params, prompt
    template, action vocabulary and grammar, sampling, the RL config, the policy definition and
    its compiled update, the society encoder's definition and the tokenized text banks.
    model_config: a `LlamaConfig` to build for instead of the config's model (a random
    preset-shaped model, e.g. with fewer layers)."""
    if not checked:
        checks.check(config)  # before anything is built or compiled
    c = config
    mesh = mesh if mesh is not None else sharding.make_mesh(tuple(c.mesh.shape))
    args = run_config.model_args(c)
    model_config = model_config or loading.load_config(**args)
    tokenizer = loading.resolve_tokenizer(
        c.tokenizer or loading.default_tokenizer(args["path_or_preset"]), model_config)
    stop_ids = loading.stop_token_ids(tokenizer, model_config)
    a = int(c.agents.num_agents)
    active = int(c.agents.get("active_per_tick", 0)) or a
    sp = society.make_params(**run_config.society_fields(c), num_agents=a)
    cohorts = cohorts_lib.from_config(c)
    personas = cohorts_lib.personas(
        cohorts, [c.agents.personas[i % len(c.agents.personas)] for i in range(a)])
    # tool_call: the tools, their arguments and one example call (or agents.tool_instruction)
    instruction, footer = run_config.prompt_text(c, lambda: tool_calls.tool_instruction(
        c.agents.actions, sp.feed_size))
    vocab = actions.ActionVocab.build(tokenizer, c.agents.actions, sp.feed_size, stop_ids,
                                      sp.feed_comments)
    n_new = int(c.rollout.max_new_tokens)
    grammar = _grammar(c, tokenizer, model_config, sp, vocab, n_new)
    template = prompt_template(c, tokenizer, sp, personas, instruction, footer)
    # with cohorts each trainable cohort's update sees its own rows: a tick is its acting agents
    group_rows = active if cohorts is None else cohorts.active[cohorts.trained[0]]
    rl_config = run_config.algo_config(c, group_rows, template.max_len + n_new,
                                       tuple(mesh.shape.values()), stop_ids=stop_ids)
    _check_group(c, group_rows, rl_config)
    pdef = _policy_def(c, model_config)
    update = _update_fields(c, rl_config, pdef, grammar)  # rl_config, update, old_* sources
    code = bool(c.code.enabled)
    return Setup(
        config=c, mesh=mesh, model_config=model_config, tokenizer=tokenizer,
        stop_ids=tuple(stop_ids), num_agents=a, active=active,
        # [A, 24] activity weights over the society's clock (None: a uniform subset).
        activation=activation.from_config(c.agents.get("activation", None), a, int(c.seed),
                                          active_per_tick=active,
                                          hours=activation.hours_of_run(c)),
        social_params=sp, personas=personas, template=template, vocab=vocab,
        tools=_tools(c, tokenizer, sp, model_config), grammar=grammar,
        sampling=_sampling(c, stop_ids, template.max_len), pdef=pdef,
        weight_shardings=weight_shardings(model_config, mesh),
        **update, encoder=_encoder_def(c, tokenizer, model_config, sp),
        text_tokens=_text_tokens(c, tokenizer, sp, personas, code),
        code=code,
        # One compiled program per epoch unless a reward is computed on the host (code bonus).
        fused=bool(c.train.get("fused_epoch", True)) and not code, cohorts=cohorts)


def with_micro_batch(setup: Setup, micro: int) -> Setup:
    """`setup` with `micro` rows per gradient micro-batch and scoring chunk: its RL config,
    update and old log-prob / value sources rebuilt (`fit.fit_run` halving an automatic
    micro-batch that does not fit)."""
    rl_config = setup.rl_config.replace(micro_batch=int(micro))
    return dataclasses.replace(
        setup, **_update_fields(setup.config, rl_config, setup.pdef, setup.grammar))


def _update_fields(c, rl_config, pdef, grammar) -> dict:
    """`Setup`'s RL config, its compiled PPO / GRPO update and where the update's old
    log-probs and values come from (`policy.old_logprobs_source` / `old_values_source`)."""
    make = grpo_lib.make_update if c.rl.algo == "grpo" else ppo_lib.make_update
    old_logprobs = policy_lib.old_logprobs_source(pdef, rl_config, True)
    return dict(rl_config=rl_config, update=make(rl_config, pdef, grammar=grammar),
                old_logprobs=old_logprobs,
                old_values=policy_lib.old_values_source(pdef, rl_config, old_logprobs))


def _sampling(c, stop_ids, prompt_len: int) -> SamplingConfig:
    """The rollout's sampling (`rollout.*`; prompts bucketed to the template's length)."""
    return SamplingConfig(
        max_new_tokens=int(c.rollout.max_new_tokens), temperature=run_config.temperature(c),
        top_k=int(c.rollout.top_k), top_p=float(c.rollout.top_p), stop_token_ids=stop_ids,
        prompt_bucket=prompt_len, decode_buckets=int(c.rollout.get("decode_buckets", 1)))


def _tools(c, tokenizer, sp, model_config) -> Optional[tool_calls.ToolVocab]:
    """The tool-call vocabulary (agents.action_mode="tool_call"; None otherwise)."""
    if c.agents.action_mode != "tool_call":
        return None
    return tool_calls.ToolVocab.build(tokenizer, c.agents.actions, sp.feed_size,
                                      model_config.vocab_size, sp.feed_comments)


def prompt_template(c, tokenizer, sp: SocialParams, personas, instruction: str,
                    footer: str) -> prompting.PromptTemplate:
    """The agents' prompt (their personas and feed) with this instruction and footer."""
    a = len(personas)
    return prompting.PromptTemplate.build(
        tokenizer, list(personas), instruction, footer, sp.feed_size, sp.content_len,
        names=[c.agents.names[i % len(c.agents.names)] for i in range(a)]
        if c.agents.names else None, newest_comment=bool(c.agents.newest_comment),
        num_users=sp.num_users, feed_comments=sp.feed_comments)


def _grammar(c, tokenizer, model_config, sp, vocab, n_new: int):
    """The action grammar (constrained mode; None otherwise), after the room checks."""
    lengths = np.asarray(vocab.prefix_len)
    longest_prefix = int(np.max(lengths))
    max_text = min(sp.content_len, n_new - longest_prefix - 1)
    if max_text < 1:
        row = int(np.argmax(lengths))
        text = tokenizer.decode([int(t) for t in np.asarray(vocab.prefixes)[row, :longest_prefix]])
        # A numbered label ("comment 16:") grows with the feed: name the key that sized it.
        why = ""
        if int(np.asarray(vocab.feed_pos)[row]) >= 0:
            why = (f", numbered up to society.feed_size={sp.feed_size}"
                   + (f" x society.feed_comments={sp.feed_comments}"
                      if bool(np.asarray(vocab.to_comment)[row]) else ""))
        raise ValueError(
            f"rollout.max_new_tokens={n_new} leaves no room for text after the longest action "
            f"prefix ({longest_prefix} tokens: {text.strip()!r}{why}) and a stop token: raise "
            f"rollout.max_new_tokens to at least {longest_prefix + 2}"
            + (" or lower society.feed_size" if why else ""))
    if c.agents.action_mode == "tool_call":
        tool_calls.check_tool_call_room(tokenizer, c.agents.actions, sp.feed_size, n_new)
    if c.agents.action_mode != "constrained":
        return None
    # Free text excludes special tokens only (id 0 is a real token, e.g. "!" in Llama-3).
    specials = sorted(set(tokenizer.added_tokens_decoder))
    return vocab.grammar(model_config.vocab_size, max_text, specials)


def _check_group(c, active: int, rl_config) -> None:
    """A GRPO group must split the agents acting in one tick evenly (`rl.group_size`)."""
    if c.rl.algo == "grpo" and active % rl_config.group_size:
        raise ValueError(f"rl.group_size={rl_config.group_size} must divide the agents acting "
                         f"per tick ({active}): a group never spans two ticks")


def _lora(c):
    """The LoRA config (None without rl.lora_rank)."""
    if int(c.rl.lora_rank) > 0:
        return lora_lib.LoraConfig(rank=int(c.rl.lora_rank), alpha=float(c.rl.lora_alpha))
    return None


def _value_mode(c) -> str:
    return "none" if c.rl.algo == "grpo" else c.rl.value_mode


def _policy_shapes(c, model_config):
    """(policy definition, params, reference): the policy's graph, value mode and LoRA, and
    `jax.eval_shape` of its initialiser's weights."""
    box = {}

    def init():
        model = llama.Llama(model_config, rngs=nnx.Rngs(0))
        box["pdef"], params, ref = policy_lib.init_policy(
            model, jax.random.key(0), lora=_lora(c), value_mode=_value_mode(c))
        return params, ref
    params, ref = jax.eval_shape(init)
    return box["pdef"], params, ref


def _policy_def(c, model_config) -> policy_lib.PolicyDef:
    return _policy_shapes(c, model_config)[0]


def _encoder_def(c, tokenizer, model_config, sp) -> EncoderDef:
    kind = c.society.get("encoder", "reference")  # checked by checks.check
    if kind == "minilm":
        graphdef, retokenizer = society_encoder.minilm_def(tokenizer)
        return EncoderDef(kind=kind, graphdef=graphdef, retokenizer=retokenizer)
    h, d = model_config.hidden_size, sp.embed_dim
    return EncoderDef(kind=kind, projection=(
        jax.random.normal(jax.random.key(int(c.seed) + 7919), (h, d)) / np.sqrt(h)))


def _text_tokens(c, tokenizer, sp, personas, code: bool) -> TextTokens:
    """The crowd's post and comment banks (configs/code.py: its problems, by post id), the
    interest descriptions and the personas, tokenized."""
    t = c.get("crowd_text", None) or {}
    corpus = text_bank.load_corpus(t.get("path", "") or None)
    L = sp.content_len
    if code:
        post_tok = text_bank.tokenize(tokenizer, code_problems.TEXTS, L)
        post_topic = np.arange(len(code_problems.TEXTS))
    else:
        post_tok, post_topic = text_bank.tokenize(tokenizer, corpus.posts, L), corpus.post_topic
    keep = set(text_bank.topic_ids(corpus, t.get("topics", ()) or corpus.topics))
    return TextTokens(
        posts=post_tok, post_topic=np.asarray(post_topic),
        comments=text_bank.tokenize(tokenizer, corpus.comments, L),
        comment_topic=np.asarray(corpus.comment_topic),
        long=text_bank.tokenize(tokenizer, list(corpus.interests) + list(personas)),
        interest_topic=tuple(int(k) for k in corpus.interest_topic),
        desc=tuple(i for i, k in enumerate(corpus.interest_topic) if k in keep),
        topics=tuple(corpus.topics), temperature=float(t.get("temperature", 0.05)),
        by_id=code)


# ---------------------------------------------------------------------------------------------
# weights


def init_weights(config: ml_collections.ConfigDict, setup: Setup) -> Weights:
    """The run's initial weights: the checkpoint (or `model.preset` at random from
    `config.seed`), split into the policy's trainable params and the frozen reference
    (`policy.init_policy`, LoRA adapters and value head from `config.seed + 1`), and the
    society's sentence encoder. Abstract: `jax.eval_shape(functools.partial(init_weights,
    config, setup))` reads and allocates no weight (no checkpoint in the config)."""
    args = run_config.model_args(config)
    if not config.model.checkpoint and setup.model_config != loading.load_config(**args):
        # a model_config given to build_setup: a random model of that shape
        model = llama.Llama(setup.model_config, rngs=nnx.Rngs(int(config.seed)))
    else:
        model = loading.load_model(**args, seed=int(config.seed))
    if model.config != setup.model_config:
        raise ValueError(f"model {args['path_or_preset']!r} loaded with {model.config}, but "
                         f"the set-up was built for {setup.model_config}")
    _, params, ref = policy_lib.init_policy(
        model, jax.random.key(int(config.seed) + 1), lora=_lora(config),
        value_mode=_value_mode(config))
    encoder = None
    if setup.encoder.kind == "minilm":
        _, encoder, _ = society_encoder.load_minilm(setup.tokenizer)
    return Weights(params=params, ref=ref, encoder=encoder)


# ---------------------------------------------------------------------------------------------
# the text banks


def embed_text(setup: Setup, weights: Weights) -> Text:
    """The society's texts (`setup.text_tokens`) through its frozen encoder: the sentence
    encoder, or the reference policy's pooled states through the fixed projection (the post
    bank's mean pooled state subtracted first). The encoder's rows (MiniLM's embeddings; a
    checkpoint's pooled states) are cached on disk (`embed_cache`; crowd_text.cache)."""
    tt, c = setup.text_tokens, setup.config
    short_tok = np.concatenate([tt.posts, tt.comments])
    cache_dir = os.path.join(zoo.cache_dir(), "text_bank") if c.crowd_text.cache else None
    if setup.encoder.kind == "minilm":
        e = setup.encoder
        embed_jit = jax.jit(functools.partial(society_encoder.minilm_embed, e.graphdef,
                                              e.retokenizer))

        def embed(rows):
            key = (embed_cache.minilm_key(zoo.MINILM_PINS, *e.retokenizer(rows))
                   if cache_dir else None)
            return embed_cache.cached_rows(lambda r: text_bank.embed_rows(
                lambda x: embed_jit(weights.encoder, x), r), rows, key, cache_dir)
        return _text(setup, embed(short_tok), embed(tt.long), None)
    # The costly pass with a real model. The centre is the mean over the post bank:
    # subtracting it keeps embeddings spread over directions (raw pooled states of an LLM
    # share a large common component, which would make every post look alike to the crowd).
    # Only a checkpoint's are cached: a preset's random weights have no file to name them.
    pooled_jit = jax.jit(functools.partial(society_encoder.pooled_states, setup.pdef.graphdef))
    key = (embed_cache.checkpoint_key(run_config.model_args(c))
           if c.model.checkpoint else None)
    pooled = lambda rows: embed_cache.cached_rows(  # noqa: E731
        lambda r: text_bank.embed_rows(lambda x: pooled_jit(weights.ref, x), r),
        rows, key, cache_dir)
    short = pooled(short_tok)
    center = jnp.asarray(short[:len(tt.posts)].mean(0))
    project = lambda h: np.asarray(society_encoder.project(  # noqa: E731
        jnp.asarray(h), center, setup.encoder.projection))
    return _text(setup, project(short), project(pooled(tt.long)), center)


def _text(setup: Setup, short_emb: np.ndarray, long_emb: np.ndarray, center) -> Text:
    tt = setup.text_tokens
    n, nd, desc = len(tt.posts), tt.descriptions, list(tt.desc)
    interest_bank = text_bank.make_bank(tt.long[desc], long_emb[desc],
                                        [tt.interest_topic[i] for i in desc])
    return Text(
        crowd_text=text_bank.CrowdText(
            posts=text_bank.make_bank(tt.posts, short_emb[:n], tt.post_topic),
            comments=text_bank.make_bank(tt.comments, short_emb[n:], tt.comment_topic),
            temperature=jnp.float32(tt.temperature), by_id=tt.by_id),
        interest_bank=interest_bank, agent_interest=jnp.asarray(long_emb[nd:]),
        # For the agents' topic metrics: the crowd's interest centre (its users draw the kept
        # descriptions uniformly) and each topic's centroid over all descriptions.
        crowd_center=normalize(interest_bank.embedding.mean(0)),
        topic_centroids=text_bank.topic_centroids(text_bank.make_bank(
            tt.long[:nd], long_emb[:nd], tt.interest_topic), len(tt.topics)),
        center=center)


def abstract_text(setup: Setup) -> Text:
    """The `Text` that `embed_text` gives, as ShapeDtypeStructs (no encoder pass)."""
    tt, d = setup.text_tokens, setup.social_params.embed_dim
    f32, i32 = jnp.float32, jnp.int32
    s = jax.ShapeDtypeStruct

    def bank(tokens):
        return text_bank.TextBank(tokens=s(tokens.shape, i32), embedding=s((len(tokens), d), f32),
                                  topic=s((len(tokens),), i32))
    nd = tt.descriptions
    return Text(
        crowd_text=text_bank.CrowdText(posts=bank(tt.posts), comments=bank(tt.comments),
                                       temperature=s((), f32), by_id=tt.by_id),
        interest_bank=bank(tt.long[list(tt.desc)]),
        agent_interest=s((len(tt.long) - nd, d), f32), crowd_center=s((d,), f32),
        topic_centroids=s((len(tt.topics), d), f32),
        center=(s((setup.model_config.hidden_size,), f32)
                if setup.encoder.kind == "reference" else None))


# ---------------------------------------------------------------------------------------------
# the run state and its place on the mesh


def init_state(setup: Setup, weights: Weights, text: Text) -> RunState:
    """Fresh run: initial policy (= reference), society reset, keys from config.seed; placed
    on the mesh (`place`)."""
    return place(setup, _fresh_state(setup, weights, text))


def _fresh_state(setup: Setup, weights: Weights, text: Text) -> RunState:
    return _initial_state(int(setup.config.seed), setup.rl_config, setup.pdef, setup.cohorts,
                          setup.social_params, weights, text)


def _initial_state(seed: int, rl_config, pdef, cohorts, sp: SocialParams, weights: Weights,
                   text: Optional[Text]) -> RunState:
    key = jax.random.key(seed)
    k_train, k_soc, k_loop = jax.random.split(key, 3)
    # Fresh buffers throughout: the one-program epoch donates the state, so nothing in it
    # may share a buffer with what the run keeps (initial weights, text banks).
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731
    if cohorts is None:
        train = optim.init_train_state(rl_config, pdef, copy(weights.params),
                                       copy(weights.ref), k_train)
    else:  # every trainable cohort starts from the same adapters (B = 0: the base itself)
        train = cohorts_lib.init_train_states(
            rl_config, pdef, [copy(weights.params)] * cohorts.num_trainable,
            copy(weights.ref), k_train)
    soc = (society.reset(k_soc, sp) if text is None else
           society.reset(k_soc, sp, text.crowd_text, text.interest_bank, text.agent_interest))
    return RunState(train=train, society=copy(soc), key=jax.random.key_data(k_loop),
                    epoch=jnp.zeros((), jnp.int32))


def config_state(config: ml_collections.ConfigDict) -> RunState:
    """`init_state`'s RunState for `config` as ShapeDtypeStructs, from the config alone: the
    model's config, then `jax.eval_shape` of the policy's, the optimizer's and the society's
    initialisers. No tokenizer, grammar, weight or text pass, so it is cheap at any size; the
    society's crowd text banks (a fixed corpus) are left out."""
    c = config
    model_config = loading.load_config(**run_config.model_args(c))
    a = int(c.agents.num_agents)
    sp = society.make_params(**run_config.society_fields(c), num_agents=a)
    cohorts = cohorts_lib.from_config(c)
    active = int(c.agents.get("active_per_tick", 0)) or a
    rl_config = run_config.algo_config(
        c, active if cohorts is None else cohorts.active[cohorts.trained[0]])
    pdef, params, ref = _policy_shapes(c, model_config)
    return jax.eval_shape(
        lambda w: _initial_state(int(c.seed), rl_config, pdef, cohorts, sp, w, None),
        Weights(params=params, ref=ref))


def abstract_state(setup: Setup, weights: Weights, text: Text) -> RunState:
    """`init_state`'s RunState as ShapeDtypeStructs with their shardings (`run_state_shardings`);
    weights and text may be abstract."""
    shapes = jax.eval_shape(functools.partial(_fresh_state, setup), weights, text)
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                        shapes, run_state_shardings(setup, shapes))


def weight_shardings(model_config: llama.LlamaConfig, mesh) -> dict:
    """The model weights' shardings on `mesh` by the logical-axis rules (a pure dict)."""
    _, model_state = nnx.split(nnx.eval_shape(lambda: llama.Llama(model_config,
                                                                   rngs=nnx.Rngs(0))))
    return nnx.to_pure_dict(sharding.state_shardings(model_state, mesh))


def run_state_shardings(setup: Setup, state: RunState) -> RunState:
    """Shardings of a RunState: the train state's weights and their Adam moments by the
    logical-axis rules (`sharding.train_state_shardings`), the society's per-user arrays
    along `agents` (`sharding.society_shardings`), the rest replicated."""
    mesh = setup.mesh
    rep = sharding.replicated(mesh)
    tx, _ = optim.make_optimizer(setup.rl_config)
    train = sharding.train_state_shardings(state.train, setup.weight_shardings, mesh, tx,
                                           lora=setup.pdef.lora is not None)
    return RunState(train=train, society=sharding.society_shardings(state.society, mesh),
                    key=rep, epoch=rep)


def place(setup: Setup, state: RunState) -> RunState:
    """Put a run state on the mesh: parameters by the logical-axis rules (via their model
    metadata), everything else replicated."""
    if setup.mesh.size == 1:  # the same NamedShardings the compiled epoch returns
        return jax.device_put(state, run_state_shardings(setup, state))
    return sharding.put_global(state, run_state_shardings(setup, state))
