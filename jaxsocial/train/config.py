"""A run's configuration: the defaults every config starts from (`base_config`; configs/*.py
override what they need), the helpers that read a block (`society_fields`, `model_switches`,
`config_get`), the mapping of the `rl` block onto the algorithms' dataclasses
(`from_run_config`, `algo_config`), and the resume comparison (`resume_differences`). The checks
that run before anything is built are `train.checks.check`.

Adding a config key: declare it with its default and a comment in `base_config`, check it in
`train.checks.check` if a value can be wrong (its default must keep the behaviour from before
the key, so runs stored without it still resume), list it in `SAFE_ON_RESUME` if it may change on
resume, and read it where it is used (docs/architecture.md).

`resume_differences(stored, config)` compares the config a workdir was trained with
(`workdir/config.json`) with the new one. Only the keys in `SAFE_ON_RESUME` may change on
resume (they change neither shapes nor what the trained numbers mean), and only with
`--config.train.allow_config_change=True`; every other difference refuses the resume. The keys in
`IGNORED_ON_RESUME` are not compared (`distributed.*`: each process of a multi-process run has its
own process id, and a rerun may use another coordinator address).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, Tuple

import ml_collections

from jaxsocial.agents.tool_calls import TOOL_FOOTER
from jaxsocial.rl import config as rl_classes

PERSONAS = (
    "You are Ada, a software engineer who loves open-source tools and clean code.",
    "You are Bo, a home cook who shares quick recipes and kitchen tips.",
    "You are Cy, a climate researcher who explains new papers in plain words.",
    "You are Di, a football fan who comments on every match.",
    "You are Eve, a high-school teacher who posts study advice.",
    "You are Fu, a travel photographer who shares places and light.",
    "You are Gil, a startup founder who writes about product and growth.",
    "You are Hana, a nurse who posts about health myths and facts.",
)

INSTRUCTION = ("You are on a social network. Here are posts from your feed. Reply with one "
               "action: 'post: <text>', 'comment <n>: <text>', 'like <n>', 'repost <n>', "
               "'follow <n>' or 'nothing'.")
FOOTER = "Your action:"


def base_config() -> ml_collections.ConfigDict:
    """Every key of a run with its default, one block per section (configs/*.py override what
    they need)."""
    c = ml_collections.ConfigDict()
    c.name = "run"
    c.seed = 0
    c.model = _model_block()
    c.tokenizer = ""
    c.agents = _agents_block()
    c.society = _society_block()
    c.rollout = _rollout_block()
    c.reward = _reward_block()
    c.rl = _rl_block()
    c.train = _train_block()
    # Verifiable bonus for answers to programming problems (configs/code.py).
    c.code = ml_collections.ConfigDict(dict(enabled=False, bonus=1.0, timeout_s=5.0,
                                            memory_mb=256))
    # The society's text (jaxsocial.social.text_bank), embedded once by the frozen encoder:
    # crowd posts / comments / interest descriptions from `path` ("" = the packaged
    # assets/crowd_posts.json, 14 topics); `topics` restricts the crowd's interests to these
    # topic names (() = all); crowd text is drawn by Gumbel-max over cos / `temperature`;
    # `cache`: the encoder's rows of these texts (MiniLM's embeddings, a checkpoint's pooled
    # states) are kept under zoo.cache_dir()/text_bank/ (jaxsocial.train.embed_cache).
    c.crowd_text = ml_collections.ConfigDict(dict(path="", topics=(), temperature=0.05,
                                                  cache=True))
    c.mesh = ml_collections.ConfigDict(dict(shape=(-1, 1, 1)))
    # Multi-host: jax.distributed.initialize(); empty/-1 values are auto-detected by JAX on
    # TPU pods, SLURM and Open MPI. One process per host, all running the same command.
    c.distributed = ml_collections.ConfigDict(dict(enabled=False, coordinator_address="",
                                                   num_processes=-1, process_id=-1))
    return c


def _model_block() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        preset="tiny", checkpoint="", require_checkpoint=False, dtype="float32",
        param_dtype="float32", remat=False,  # remat: recompute layers in the backward pass
        attention_chunk=0,  # queries per attention block (0 = all): bounds [B, h, T, S]
        scan_layers=False))  # the layers as one lax.scan: gathers stay per layer, fast compile


def _agents_block() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        num_agents=16,
        active_per_tick=0,        # agents acting per tick (a random subset); 0 = all of them
        # Who acts (jaxsocial.social.activation): off = a uniform subset each tick; on = drawn
        # by per-agent activity over the society's 24-hour clock (heavy-tailed base rate,
        # log-std `sigma`, times a daily curve peaking near `peak_hour`), or by the [n, 24]
        # weights in `profile_path` (.npy / .json, cycled over agents).
        activation=ml_collections.ConfigDict(dict(
            enabled=False, sigma=1.0, diurnal_amplitude=0.8, peak_hour=20.0, peak_spread=3.0,
            profile_path="")),
        personas=PERSONAS,        # cycled over agents
        names=(),                 # feed display names, cycled; () = from "You are <Name>, ..."
        newest_comment=True,      # feed posts show their newest comment (longer prompts)
        instruction=INSTRUCTION,
        footer=FOOTER,
        # "constrained" (grammar) | "free" (parse, count failures) | "tool_call" (an OASIS-style
        # JSON function call, parsed leniently; failures counted by kind)
        action_mode="constrained",
        tool_instruction="",      # tool_call: the prompt's instruction; "" = listing the tools
        #                           and one example call (agents.tool_calls.tool_instruction)
        tool_footer=TOOL_FOOTER,  # tool_call: the prompt's footer (in place of `footer`)
        actions=("post", "comment", "like", "repost", "follow", "nothing"),
        # ((epoch, question), ...): after those epochs every LLM agent answers the question in
        # its own context (persona + current feed), greedily, outside the society (nothing
        # posted, no reward); the answers go to interviews.jsonl and summary.md.
        interviews=(),
        # Several policies in one society (jaxsocial.train.cohorts, docs/cohorts.md): a tuple of
        # dicts {name, share | ids, trainable, reward: {like, repost, comment, new_followers},
        # personas}; each trainable cohort trains its own LoRA adapter over the shared base.
        # () = one trainable policy for every agent.
        cohorts=(),
    ))


def _society_block() -> ml_collections.ConfigDict:
    # Passed to jaxsocial.social.state.SocialParams (num_agents is set from agents.num_agents).
    return ml_collections.ConfigDict(dict(
        num_users=2048, num_personas=4, embed_dim=16, post_capacity=2048, content_len=12,
        num_seed_posts=256, feed_size=4, pool_size=128, recsys="twitter", crowd=True,
        max_active=256, crowd_budget=512,
        # The society's embedding space (train.society_encoder): "reference" = the frozen
        # reference policy's pooled states through a fixed random projection to embed_dim;
        # "minilm" = all-MiniLM-L6-v2's sentence embedding of the posts' text (embed_dim=384).
        encoder="reference"))


def _rollout_block() -> ml_collections.ConfigDict:
    rollout = ml_collections.ConfigDict(dict(
        ticks_per_epoch=8, max_new_tokens=16, temperature=0.7, top_k=0, top_p=1.0,
        decode_buckets=1))  # SamplingConfig.decode_buckets: > 1 pays for long responses only
    # The sampling temperature in tool_call mode (None: rollout.temperature): a small model
    # writes valid JSON far more often when it samples colder.
    rollout.tool_call_temperature = ml_collections.config_dict.placeholder(float)
    return rollout


def _reward_block() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        horizon=4,           # H ticks after creation
        settle=True,         # H-1 crowd-only ticks end each epoch so every post sees its horizon
        like=1.0, repost=0.0, comment=0.0, new_followers=0.0,
        # weights on the reports and dislikes a post draws (negative to penalise them; the
        # crowd dislikes, only LLM agents report); either non-zero records them (see
        # `engagement_channels`)
        report=0.0, dislike=0.0,
        # An answer that created no post (like, comment, nothing, ...): "constant" = scored
        # reward.non_post; "mean" = the epoch's mean post score; "skip" = no update on it (its
        # tokens are masked out of the loss)
        non_post_mode="constant",
        non_post=0.0,
        normalize="none",    # "none" | "whiten" (per epoch) | "running"
    ))


def _rl_block() -> ml_collections.ConfigDict:
    # Every PPOConfig / GRPOConfig field under its own name, with the dataclass defaults
    # (shared fields: PPO's; table in docs/rl.md): learning_rate=3e-6, ppo_epochs=4,
    # num_minibatches=1, micro_batch=0 (rows per gradient-accumulation micro-batch and scoring
    # chunk; 0 = chosen from rl.micro_tokens: `micro_batch`), logits_chunk=0 (auto),
    # clip_eps=0.2, kl_coef=0.05 (adaptive_kl: its start), lr_schedule, clip_eps_high,
    # kl_target, loss_aggregation, ... Sampling fields come from c.rollout, reward_norm from
    # c.reward.normalize.
    rl = ml_collections.ConfigDict(dict(
        algo="ppo",          # "ppo" | "grpo"
        value_mode="head",   # PPO critic: "head" | "critic"
        lora_rank=0, lora_alpha=16.0,  # lora_rank > 0: train adapters only (ref = base)
        # rl.micro_batch=0 (and grad_accum_steps=1): rows per micro-batch chosen so that one
        # holds at most this many tokens per data shard (`micro_batch`)
        micro_tokens=MICRO_TOKENS,
        **run_config_fields()))
    rl.group_size = 0      # GRPO: 0 = the agents acting in one tick form a group
    return rl


def _train_block() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        epochs=4, checkpoint_every=1, keep_checkpoints=3, log_samples=4, export_hf=True,
        # "W/checkpoints/N": start from run W's whole state at its epoch N (society, policy,
        # optimizer, keys) and train on from there; only FORK_MAY_CHANGE keys may differ
        # from W's config.json. "" = a fresh run.
        fork_from="",
        allow_config_change=False,  # True: resume accepts changed train.* keys (SAFE_ON_RESUME)
        fused_epoch=True,  # one compiled program per epoch (not with a host-side code bonus)
        # launch/train.py compiles the epoch for this target first and refuses a run that does
        # not fit it: "" (no pre-flight), "auto" (this process's devices), "tpu:v5e:8x8",
        # "gpu:h100:8", ... (jaxsocial.scale.targets)
        preflight="",
        text_metrics_posts=4096,  # text drift / topics / top posts over the first K posts
        # True: each epoch's trajectories as a TFDS dataset in W/dataset/ (RLDS episodes;
        # jaxsocial.train.dataset; needs pip install -e '.[tfds]')
        dataset=False))


def society_fields(c: ml_collections.ConfigDict) -> dict:
    """The `jaxsocial.social.state.SocialParams` fields a run's config sets: all of
    `c.society`'s keys but `encoder`, which picks the society's embedding space
    (`train.society_encoder`), and from the reward its horizon and `engagement_channels`."""
    fields = {k: v for k, v in dict(c.society).items() if k != "encoder"}
    return dict(fields, reward_horizon=int(config_get(c, "reward.horizon", 1)),
                engagement_channels=engagement_channels(c))


# The reward.* weights of StepInfo.engagement_delta's channels, in its order: the first three
# always recorded, the last two with `SocialParams.engagement_channels=5`.
ENGAGEMENT_REWARDS = ("like", "repost", "comment", "report", "dislike")


def engagement_channels(c: ml_collections.ConfigDict) -> int:
    """`SocialParams.engagement_channels`: 5 where `reward` or any cohort's reward weighs
    reports or dislikes, else 3, so the record stays as small as the reward needs. A malformed
    cohort is skipped here; the config check names it."""
    rewards = [c.get("reward") or {}] + [e.get("reward") or {} for e in
                                         c.get("agents", {}).get("cohorts", ()) or ()
                                         if hasattr(e, "get")]
    weighed = any(w.get(k) for w in rewards if hasattr(w, "get")
                  for k in ENGAGEMENT_REWARDS[3:])
    return 5 if weighed else 3


def taste_driven_society(num_users: int, feed_size: int) -> dict:
    """`c.society` overrides of the small demo societies (demo, smol): one persona, likes driven
    by post-interest similarity only (no popularity feedback, so one lucky post does not
    dominate an epoch's average), `num_users` users and as many post slots."""
    return dict(num_users=num_users, num_personas=1, embed_dim=16, post_capacity=num_users,
                content_len=12, num_seed_posts=num_users // 8, feed_size=feed_size,
                pool_size=num_users // 8, w_pop=0.0, recency_tau=6.0, explore_frac=0.1,
                max_active=num_users // 8, crowd_budget=num_users // 4, activation_rate=0.1,
                interest_noise=0.3, like_bias=-5.0, like_sim=8.0, like_pop=0.0, p_post=0.02)


def smoke(c: ml_collections.ConfigDict, content_len: int = 12,
          max_new_tokens: int = 8) -> ml_collections.ConfigDict:
    """The `:smoke` variant of any config: tiny random Llama, 8 agents, 4 ticks, one update.

    Big enough that the epoch has a learning signal (tests assert it): 32 answers of the random
    model include posts (about one answer in eight is a post), the crowd likes some of them, so
    rewards and the update's gradient are non-zero. 4 agents x 2 ticks created no post.
    """
    c.model.preset = "tiny"
    c.model.require_checkpoint = False
    c.model.dtype = c.model.param_dtype = "float32"
    c.agents.num_agents = 8
    c.society.update(num_users=256, embed_dim=16, post_capacity=256, content_len=content_len,
                     num_seed_posts=32, feed_size=3, pool_size=32, max_active=32,
                     crowd_budget=64)
    c.rollout.ticks_per_epoch = 4
    if c.agents.activation.enabled:  # e.g. general.py: 4 of the 8 agents act, over 8 hours
        c.agents.active_per_tick = 4
        c.rollout.ticks_per_epoch = 8
    else:
        c.agents.active_per_tick = 0
    c.rollout.max_new_tokens = max_new_tokens
    c.reward.horizon = 2
    c.rl.ppo_epochs = 1
    c.rl.num_minibatches = 1
    c.train.epochs = 1
    c.train.checkpoint_every = 1
    return c


# ----------------------------------------------------------------------------------------------
# The `rl` block -> PPOConfig / GRPOConfig
# Names the `rl` block had before it took the dataclasses' own: no longer keys (an error names
# the new key), and ignored where an older workdir's config.json still holds them.
RENAMED = {"lr": "learning_rate", "minibatches": "num_minibatches", "entropy_coef": "ent_coef"}
# Set by the loop from elsewhere in the config, never from `c.rl`.
LOOP_SET = {"stop_token_ids": "the tokenizer's stop tokens", "temperature": "rollout.temperature",
            "top_k": "rollout.top_k", "top_p": "rollout.top_p",
            "reward_norm": "reward.normalize"}


ALGOS = {"ppo": rl_classes.PPOConfig, "grpo": rl_classes.GRPOConfig}


def run_config_fields() -> dict:
    """{name: default} of every PPOConfig / GRPOConfig field a run config sets under its own
    name: the shared OptimConfig fields (PPO's defaults), then PPO's and GRPO's own."""
    out = rl_classes.config_fields(ALGOS["ppo"], [n for n in rl_classes.base_field_names()
                                                 if n not in LOOP_SET])
    for cls in ALGOS.values():
        out.update(rl_classes.config_fields(cls, [n for n in rl_classes.specific_field_names(cls)
                                                 if n not in LOOP_SET]))
    return out


def from_run_config(rl, *, loop_keys=(), **fixed):
    """Build the PPOConfig / GRPOConfig of `rl["algo"]` from a run config's `rl` block.

    rl: mapping with "algo" and any fields of `run_config_fields()`;
    loop_keys: other keys the caller reads itself (value_mode, lora_rank, ...); fixed: values
    the caller sets from elsewhere (stop_token_ids, temperature, ...; ignored when the class
    lacks the field). Raises one ValueError naming every unknown key (a renamed one with its
    new name); the dataclass checks the values.
    """
    rl = dict(rl)
    algo = rl.get("algo", "ppo")
    if algo not in ALGOS:
        raise ValueError(f"rl.algo={algo!r}; choose one of {sorted(ALGOS)}")
    fields = run_config_fields()
    known = set(fields) | set(loop_keys) | {"algo"}
    unknown = sorted(set(rl) - known)
    if unknown:
        hints = [f"rl.{k} (set by {LOOP_SET[k]})" if k in LOOP_SET else
                 f"rl.{k} (now rl.{RENAMED[k]})" if k in RENAMED else f"rl.{k}"
                 for k in unknown]
        raise ValueError(f"unknown config key(s) {', '.join(hints)}; the rl block takes the "
                         f"fields of PPOConfig / GRPOConfig under their own names (docs/rl.md)")
    cls = ALGOS[algo]
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in rl.items() if k in names}
    kwargs.update({k: v for k, v in fixed.items() if k in names})
    return cls(**kwargs)


def config_get(c, dotted: str, default=None):
    """`c["a"]["b"]` for `dotted` = "a.b", or `default` where a part is missing (configs of
    other launchers, partial test configs)."""
    for part in dotted.split("."):
        if not hasattr(c, "get") or part not in c:
            return default
        c = c[part]
    return c


_get = config_get


def model_switches(m) -> dict:
    """The `LlamaConfig` switches a config's `model` block sets over the checkpoint's or
    preset's own (remat, attention_chunk, scan_layers)."""
    return dict(remat=bool(m.remat), attention_chunk=int(m.get("attention_chunk", 0)),
                scan_layers=bool(m.get("scan_layers", False)))


def model_args(config) -> dict:
    """`models.loading.load_model` / `load_config`'s arguments for a run's `model` block: the
    checkpoint (or the preset), the dtypes and the switches."""
    m = config.model
    return dict(path_or_preset=m.get("checkpoint", "") or m.preset,
                dtype=m.get("dtype") or None, param_dtype=m.get("param_dtype") or None,
                **model_switches(m))


def temperature(config) -> float:
    """The rollout's sampling temperature: `rollout.tool_call_temperature` in tool_call mode
    when set, else `rollout.temperature`."""
    t = _get(config, "rollout.tool_call_temperature")
    if _get(config, "agents.action_mode") == "tool_call" and t is not None:
        return float(t)
    return float(config.rollout.temperature)


def prompt_text(config, tool_instruction) -> Tuple[str, str]:
    """(instruction, footer) of the agents' prompt: `agents.instruction` / `agents.footer`, or in
    tool_call mode `agents.tool_instruction` (default: `tool_instruction()`, the caller's
    listing of the tools) and `agents.tool_footer`."""
    footer = str(_get(config, "agents.footer", "") or "")
    if _get(config, "agents.action_mode") != "tool_call":
        return str(_get(config, "agents.instruction", "") or ""), footer
    return (str(_get(config, "agents.tool_instruction", "") or "") or tool_instruction(),
            str(_get(config, "agents.tool_footer", "") or footer))


# The rl block's keys that are no PPOConfig / GRPOConfig field: the loop reads them itself.
RL_LOOP_KEYS = ("value_mode", "lora_rank", "lora_alpha", "micro_tokens")

# Tokens per data shard in one automatic micro-batch (rl.micro_batch=0). The update keeps
# every layer's [rows, heads, seq, seq] attention for its backward (about 47 MB a row for the
# demo's 592-token rows), and on the CPU the demo's 6-row micro-batches train faster than all
# 192 rows at once (docs/train.md, "Memory").
MICRO_TOKENS = 4096


def micro_batch(config: ml_collections.ConfigDict, rows: int, seq_len: int,
                mesh_shape=None) -> int:
    """Rows per gradient micro-batch (and per scoring chunk) for minibatches of `rows` rows
    of `seq_len` tokens (prompt + response) on a mesh of `mesh_shape` (data, fsdp, tensor).

    `rl.micro_batch` > 0, or `rl.grad_accum_steps` > 1, is the user's choice and is returned
    as set (0 with grad_accum_steps: the minibatch split that many ways). Otherwise
    (automatic): the largest divisor m of `rows` with m * seq_len <= rl.micro_tokens tokens
    per data shard, a multiple of the data shards the rows split over (and of
    `rl.prompt_group`, where one divides the rows), at least one row per shard; at most
    `rows` (all of them at once: micro_tokens <= 0)."""
    rl = config.rl
    if int(rl.micro_batch or 0) > 0 or int(rl.get("grad_accum_steps", 1)) > 1:
        return int(rl.micro_batch or 0)
    rows, seq_len = max(1, int(rows)), max(1, int(seq_len))
    if not micro_batch_is_automatic(config):
        return rows
    shards, step = micro_step(config, rows, mesh_shape)
    budget = int(rl.get("micro_tokens", MICRO_TOKENS)) * shards
    fits = [m for m in range(step, rows + 1, step) if rows % m == 0 and m * seq_len <= budget]
    return max(fits) if fits else step


def micro_batch_is_automatic(config: ml_collections.ConfigDict) -> bool:
    """Whether the micro-batch is the run's to choose: no rl.micro_batch, rl.grad_accum_steps
    nor rl.micro_tokens=0 ("all rows at once") of the user's."""
    rl = config.rl
    return (int(rl.micro_batch or 0) == 0 and int(rl.get("grad_accum_steps", 1)) <= 1
            and int(rl.get("micro_tokens", MICRO_TOKENS)) > 0)


def micro_step(config: ml_collections.ConfigDict, rows: int, mesh_shape=None) -> tuple:
    """(data shards `rows` split over on `mesh_shape`, the step an automatic micro-batch is a
    multiple of: those shards, and `rl.prompt_group` where the rows hold whole groups)."""
    from jaxsocial.models import partitioning
    sizes = dict(zip(partitioning.AXES, tuple(mesh_shape or (1, 1, 1))))
    shards = math.prod(sizes[a] for a in partitioning.row_axes(sizes, "batch", rows))
    group = int(config.rl.get("prompt_group", 0) or 0)
    if group > 1 and rows % math.lcm(shards, group) == 0:
        return shards, math.lcm(shards, group)
    return shards, shards


def algo_config(config: ml_collections.ConfigDict, active: int, seq_len: int = 0,
                mesh_shape=None, stop_ids=()):
    """The run's PPOConfig / GRPOConfig from `config.rl` (`from_run_config`), sampling from
    `config.rollout`, PPO's reward_norm from `config.reward.normalize`; `active` agents per
    tick are GRPO's default group (`rl.group_size=0`). stop_ids: the tokenizer's stop ids (()
    for sizing). seq_len > 0 (prompt + response tokens): an automatic `rl.micro_batch` is
    resolved (`micro_batch`, for minibatches of ticks x active / num_minibatches rows on
    `mesh_shape`); 0 leaves it as set."""
    c = config
    group = int(_get(c, "rl.group_size", 0) or 0) or active
    fixed = {}
    if seq_len > 0:
        rows = int(c.rollout.ticks_per_epoch) * active // max(1, int(c.rl.num_minibatches))
        fixed["micro_batch"] = micro_batch(c, rows, seq_len, mesh_shape)
    return from_run_config(
        c.rl, loop_keys=RL_LOOP_KEYS,
        stop_token_ids=tuple(stop_ids), temperature=temperature(c), top_k=int(c.rollout.top_k),
        top_p=float(c.rollout.top_p), group_size=group,
        reward_norm="running" if _get(c, "reward.normalize") == "running" else "none",
        **fixed)


# ----------------------------------------------------------------------------------------------
# The resume comparison

# Keys that may differ between a run and its resumption. Everything else (model, agents,
# society, rollout, reward, rl, code, seed, tokenizer) changes shapes or semantics.
SAFE_ON_RESUME = (
    "name",                   # only names the default workdir
    "train.epochs",           # train longer (or stop earlier)
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.log_samples",
    "train.export_hf",
    "train.fused_epoch",      # one program or three: same run
    "train.text_metrics_posts",
    "train.preflight",        # a check before the run, not part of it
    "mesh.shape",             # restore re-shards onto the new mesh
    "rl.micro_batch",         # memory against time: the same update up to float32 rounding
    "rl.micro_tokens",
)
# Not compared: the job's addresses and process ids (prefix) differ between the processes of
# one multi-process run (config.json holds process 0's), so the same commands resume.
IGNORED_ON_RESUME = ("train.allow_config_change", "distributed.")

# Keys a fork (`train.fork_from`) may set differently from the run it starts from: the
# society's dynamics (the recommender, its weights, the crowd's reaction and activity rates;
# not the shapes of its state), the reward's weights, and what SAFE_ON_RESUME allows.
FORK_MAY_CHANGE = SAFE_ON_RESUME + (
    "train.", "reward.like", "reward.repost", "reward.comment", "reward.new_followers",
    "reward.report", "reward.dislike",
    "society.recsys", "society.recency", "society.seen_policy", "society.seen_penalty",
    "society.exclude_own", "society.pool_random", "society.explore_frac", "society.crowd",
    "society.w_sim", "society.w_rec", "society.w_pop", "society.w_in", "society.recency_tau",
    "society.activation_rate", "society.activity_sigma", "society.follow_power",
    "society.like_bias", "society.like_sim", "society.like_pop", "society.like_follow",
    "society.like_activity", "society.dislike_bias", "society.dislike_sim",
    "society.p_post", "society.p_repost", "society.p_quote", "society.p_comment",
    "society.p_follow", "society.post_noise")


def _flat(tree: Any, prefix: str = "") -> Dict[str, Any]:
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = tree
    return out


def as_plain(config: ml_collections.ConfigDict) -> Dict[str, Any]:
    """The config as config.json stores it (tuples become lists)."""
    return json.loads(config.to_json_best_effort())


def _matches(key: str, patterns) -> bool:
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in patterns)


def _differences(stored: Dict[str, Any], config: ml_collections.ConfigDict, may_change
                 ) -> Tuple[Dict[str, Tuple[Any, Any]], Dict[str, Tuple[Any, Any]]]:
    """(allowed, refused) differences {key: (stored value, new value)} between a stored
    config.json and `config`, allowed where the key matches `may_change`; a missing key is
    None, and the renamed keys an older config.json still holds are ignored. A key the stored
    config lacks (it was added to `base_config` after that run) is no difference while the new
    config leaves it at its default: a new key's default is the behaviour from before it."""
    old, new = _flat(stored), _flat(as_plain(config))
    defaults = _flat(as_plain(base_config()))
    for name in RENAMED:  # an older config.json holds these beside their new keys
        old.pop(f"rl.{name}", None)
    allowed, refused = {}, {}
    for key in sorted(set(old) | set(new)):
        if _matches(key, IGNORED_ON_RESUME) or old.get(key) == new.get(key):
            continue
        if key not in old and key in defaults and new.get(key) == defaults[key]:
            continue
        (allowed if _matches(key, may_change) else refused)[key] = (old.get(key), new.get(key))
    return allowed, refused


def fork_differences(stored: Dict[str, Any], config: ml_collections.ConfigDict
                     ) -> Tuple[Dict[str, Tuple[Any, Any]], Dict[str, Tuple[Any, Any]]]:
    """(allowed, refused) differences {key: (the source run's value, the fork's)} between the
    config.json of the run a fork starts from and the fork's config (`FORK_MAY_CHANGE`)."""
    return _differences(stored, config, FORK_MAY_CHANGE)


def resume_differences(stored: Dict[str, Any], config: ml_collections.ConfigDict
                       ) -> Tuple[Dict[str, Tuple[Any, Any]], Dict[str, Tuple[Any, Any]]]:
    """(safe, unsafe) differences {key: (stored value, new value)}; a missing key is None."""
    return _differences(stored, config, SAFE_ON_RESUME)


def format_differences(diffs: Dict[str, Tuple[Any, Any]], limit: int = 6) -> str:
    def short(v):
        s = json.dumps(v)
        return s if len(s) <= 40 else s[:37] + "..."
    items = [f"{k} ({short(a)} -> {short(b)})" for k, (a, b) in diffs.items()]
    if len(items) > limit:
        items = items[:limit] + [f"{len(items) - limit} more"]
    return ", ".join(items)
