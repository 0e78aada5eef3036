"""Defaults shared by every Social-RL config (configs/*.py override what they need)."""
import ml_collections

from jaxsocial.rl import common as rl_common

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
    c = ml_collections.ConfigDict()
    c.name = "run"
    c.seed = 0
    c.model = ml_collections.ConfigDict(dict(
        preset="tiny", checkpoint="", require_checkpoint=False, dtype="float32",
        param_dtype="float32", remat=False,  # remat: recompute layers in the backward pass
        attention_chunk=0,  # queries per attention block (0 = all): bounds [B, h, T, S]
        scan_layers=False))  # the layers as one lax.scan: gathers stay per layer, fast compile
    c.tokenizer = ""
    c.agents = ml_collections.ConfigDict(dict(
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
        actions=("post", "comment", "like", "repost", "follow", "nothing"),
    ))
    # Passed to jaxsocial.social.state.SocialParams (num_agents is set from agents.num_agents).
    c.society = ml_collections.ConfigDict(dict(
        num_users=2048, num_personas=4, embed_dim=16, post_capacity=2048, content_len=12,
        num_seed_posts=256, feed_size=4, pool_size=128, recsys="twitter", crowd=True,
        max_active=256, crowd_budget=512,
        # The society's embedding space (train.society_encoder): "reference" = the frozen
        # reference policy's pooled states through a fixed random projection to embed_dim;
        # "minilm" = all-MiniLM-L6-v2's sentence embedding of the posts' text (embed_dim=384).
        encoder="reference"))
    c.rollout = ml_collections.ConfigDict(dict(
        ticks_per_epoch=8, max_new_tokens=16, temperature=0.7, top_k=0, top_p=1.0,
        decode_buckets=1))  # SamplingConfig.decode_buckets: > 1 pays for long responses only
    c.reward = ml_collections.ConfigDict(dict(
        horizon=4,           # H ticks after creation
        settle=True,         # H-1 crowd-only ticks end each epoch so every post sees its horizon
        like=1.0, repost=0.0, comment=0.0, new_followers=0.0,
        # An answer that created no post (like, comment, nothing, ...): "constant" = scored
        # reward.non_post; "mean" = the epoch's mean post score; "skip" = no update on it (its
        # tokens are masked out of the loss)
        non_post_mode="constant",
        non_post=0.0,
        normalize="none",    # "none" | "whiten" (per epoch) | "running"
    ))
    # Every PPOConfig / GRPOConfig field under its own name, with the dataclass defaults
    # (shared fields: PPO's; table in docs/rl.md): learning_rate=3e-6, ppo_epochs=4,
    # num_minibatches=1, micro_batch=0 (rows per gradient-accumulation micro-batch; 0 = the
    # whole minibatch), logits_chunk=0 (auto), clip_eps=0.2, kl_coef=0.05 (adaptive_kl: its
    # start), lr_schedule, clip_eps_high, kl_target, loss_aggregation, ... Sampling fields come
    # from c.rollout, reward_norm from c.reward.normalize.
    c.rl = ml_collections.ConfigDict(dict(
        algo="ppo",          # "ppo" | "grpo"
        value_mode="head",   # PPO critic: "head" | "critic"
        lora_rank=0, lora_alpha=16.0,  # lora_rank > 0: train adapters only (ref = base)
        **rl_common.run_config_fields()))
    c.rl.group_size = 0      # GRPO: 0 = the agents acting in one tick form a group
    rl_common.add_aliases(c.rl)  # rl.lr, rl.minibatches, rl.entropy_coef: old names, same values
    c.train = ml_collections.ConfigDict(dict(
        epochs=4, checkpoint_every=1, keep_checkpoints=3, log_samples=4, export_hf=True,
        allow_config_change=False,  # True: resume accepts changed train.* keys (config_check)
        fused_epoch=True,  # one compiled program per epoch (not with a host-side code bonus)
        text_metrics_posts=4096))  # text drift / topics / top posts over the first K posts
    # Verifiable bonus for answers to programming problems (configs/code.py).
    c.code = ml_collections.ConfigDict(dict(enabled=False, bonus=1.0, timeout_s=5.0,
                                            memory_mb=256))
    # The society's text (jaxsocial.social.text_bank), embedded once by the frozen encoder:
    # crowd posts / comments / interest descriptions from `path` ("" = the packaged
    # assets/crowd_posts.json, 14 topics); `topics` restricts the crowd's interests to these
    # topic names (() = all); crowd text is drawn by Gumbel-max over cos / `temperature`;
    # `cache`: with a checkpoint, the encoder's pooled states of the texts are cached on disk.
    c.crowd_text = ml_collections.ConfigDict(dict(path="", topics=(), temperature=0.05,
                                                  cache=True))
    c.mesh = ml_collections.ConfigDict(dict(shape=(-1, 1, 1)))
    # Multi-host: jax.distributed.initialize(); empty/-1 values are auto-detected by JAX on
    # TPU pods, SLURM and Open MPI. One process per host, all running the same command.
    c.distributed = ml_collections.ConfigDict(dict(enabled=False, coordinator_address="",
                                                   num_processes=-1, process_id=-1))
    return c


def society_fields(c: ml_collections.ConfigDict) -> dict:
    """The `jaxsocial.social.state.SocialParams` fields of `c.society`: all of its keys but
    `encoder`, which picks the society's embedding space (`train.society_encoder`)."""
    return {k: v for k, v in dict(c.society).items() if k != "encoder"}


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
    c.rl.minibatches = 1
    c.train.epochs = 1
    c.train.checkpoint_every = 1
    return c

