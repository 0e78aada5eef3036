"""Config checks that run before anything is built or compiled.

`check(config)` raises one ValueError listing every inconsistent value (named by its
`--config.` key) before a model is built: a bad value must not surface minutes later inside a
compiled program, nor be blamed on another key. The sizes against the hard limits come from
`train.bounds`; whether the run fits this machine is `train.fit`'s. (The keys and their
defaults: `train.config`.)
"""

from __future__ import annotations

from typing import List

import ml_collections

from jaxsocial.agents import actions
from jaxsocial.rl.config import KL_PER
from jaxsocial.rl.rewards import NON_POST_MODES, NORMALIZE_MODES
from jaxsocial.social import activation, society, text_bank
from jaxsocial.train import bounds, cohorts, society_encoder
from jaxsocial.train import config as run_config

_get = run_config.config_get


def check(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError naming every inconsistent `--config.` value (cheap: nothing is built,
    JAX's backend is not started)."""
    problems: List[str] = []

    def need(ok: bool, msg: str):
        if not ok:
            problems.append(msg)

    def num(key, default=0):
        v = _get(config, key, default)
        try:
            return float(v)
        except (TypeError, ValueError):
            problems.append(f"{key}={v!r} is not a number")
            return default

    def at_least(key, lo, default):
        need(num(key, default) >= lo, f"{key}={_get(config, key)} must be >= {lo}")

    epochs = num("train.epochs", 1)
    need(epochs >= 1 and epochs == int(epochs), f"train.epochs={_get(config, 'train.epochs')} "
         f"must be an integer >= 1")
    at_least("train.checkpoint_every", 1, 1)
    at_least("train.keep_checkpoints", 1, 1)
    at_least("train.log_samples", 0, 0)
    feed, pool = num("society.feed_size", 1), num("society.pool_size", 1)
    need(feed >= 1, f"society.feed_size={int(feed)} must be >= 1")
    need(feed <= pool, f"society.feed_size={int(feed)} > society.pool_size={int(pool)}: the "
         f"feed is chosen from the candidate pool, so feed_size must be <= pool_size")
    mode = _get(config, "reward.normalize", "none")
    need(mode in NORMALIZE_MODES, f"reward.normalize={mode!r}; choose one of "
         f"{', '.join(NORMALIZE_MODES)}")
    at_least("reward.horizon", 1, 1)
    algo = _get(config, "rl.algo", "ppo")
    need(algo in ("ppo", "grpo"), f"rl.algo={algo!r}; choose 'ppo' or 'grpo'")
    need(not (mode == "running" and algo == "grpo"), "reward.normalize='running' is done by "
         "the PPO update (rl.algo='ppo'); GRPO already normalises within each group")
    npm = _get(config, "reward.non_post_mode", "constant")
    need(npm in NON_POST_MODES, f"reward.non_post_mode={npm!r}; choose one of "
         f"{', '.join(NON_POST_MODES)}")
    need(_get(config, "reward.non_post_baseline", None) is None,
         "reward.non_post_baseline is no longer a key: use reward.non_post_mode='mean' (the "
         "epoch's mean post score), 'constant' (reward.non_post) or 'skip'")
    kl_per = _get(config, "rl.kl_per", "token")
    need(kl_per in KL_PER, f"rl.kl_per={kl_per!r}; choose one of {KL_PER}")
    need(not (kl_per != "token" and algo == "grpo"), f"rl.kl_per={kl_per!r} shapes PPO's KL "
         f"penalty in the reward; GRPO charges its KL in the loss (rl.kl_coef, "
         f"rl.loss_aggregation): leave rl.kl_per='token'")
    amode = _get(config, "agents.action_mode", "constrained")
    need(amode in ("constrained", "free", "tool_call"),
         f"agents.action_mode={amode!r}; choose 'constrained', 'free' or 'tool_call'")
    agents = num("agents.num_agents", 1)
    need(agents >= 1, f"agents.num_agents={int(agents)} must be >= 1")
    active = num("agents.active_per_tick", 0)
    need(0 <= active <= agents, f"agents.active_per_tick={int(active)} must be in "
         f"[0, agents.num_agents={int(agents)}] (0 = all)")
    if _get(config, "agents.activation.enabled", False):
        need(0 < active < agents, f"agents.activation.enabled needs 0 < agents.active_per_tick "
             f"< agents.num_agents={int(agents)} (got {int(active)}): the activation profile "
             f"decides which of the agents act each tick")
        amp = num("agents.activation.diurnal_amplitude", 0.0)
        need(0 <= amp < 1, f"agents.activation.diurnal_amplitude={amp} must be in [0, 1)")
        at_least("agents.activation.sigma", 0, 0.0)
        at_least("agents.activation.peak_spread", 0, 0.0)
    users = num("society.num_users", agents)
    need(users >= agents, f"society.num_users={int(users)} < agents.num_agents={int(agents)}")
    at_least("rollout.ticks_per_epoch", 1, 1)
    at_least("rollout.max_new_tokens", 1, 1)
    buckets, new = num("rollout.decode_buckets", 1), int(num("rollout.max_new_tokens", 1))
    need(1 <= buckets <= new, f"rollout.decode_buckets={_get(config, 'rollout.decode_buckets')} "
         f"must be in [1, {new}] (at most one decode segment per new token)")
    at_least("rollout.temperature", 0, 1.0)
    if _get(config, "rollout.tool_call_temperature") is not None:
        at_least("rollout.tool_call_temperature", 0, 1.0)
    at_least("rl.num_minibatches", 1, 1)
    at_least("rl.ppo_epochs", 1, 1)
    at_least("rl.learning_rate", 0, 0.0)
    need(not (_get(config, "model.require_checkpoint", False)
              and not _get(config, "model.checkpoint", "")),
         f"model.checkpoint is empty but config {_get(config, 'name', '?')!r} needs one "
         f"(--config.model.checkpoint=/path/to/a Hugging Face Llama, Mistral, Qwen2 or Qwen3 "
         f"directory, or a Llama .gguf; for a CPU run without weights use "
         f"--config=configs/demo.py)")
    if "agents" in config and "actions" in config.agents:
        try:
            comment_actions = actions.needs_comments(config.agents.actions)
            need(not comment_actions or num("society.feed_comments", 0) >= 1,
                 f"agents.actions {list(comment_actions)} name a shown comment: set "
                 f"society.feed_comments >= 1")
        except ValueError as e:
            problems.append(str(e))
    for item in _get(config, "agents.interviews", ()) or ():
        ok = (isinstance(item, (tuple, list)) and len(item) == 2
              and isinstance(item[1], str) and item[1].strip())
        try:
            ok = ok and 1 <= int(item[0]) <= int(epochs) and int(item[0]) == item[0]
        except (TypeError, ValueError):
            ok = False
        need(bool(ok), f"agents.interviews: {item!r} must be (epoch, question) with an "
             f"integer epoch in [1, train.epochs={int(epochs)}] and a non-empty question")
    if "agents" in config:
        for key, what in (("agents.personas", "persona"), ("agents.names", "name")):
            texts = _get(config, key, ())
            if key == "agents.names" and not texts:
                continue  # () = the names in the personas
            try:
                text_bank.check_texts(texts, key, what)
            except ValueError as e:
                problems.append(str(e))
    if not problems and _get(config, "agents.activation.enabled", False):
        try:  # the profile against agents.active_per_tick over the hours the run's ticks reach
            activation.check_config(config)
        except (ValueError, FileNotFoundError) as e:
            problems.append(str(e))
    if not problems and "society" in config:
        try:
            sp = society.make_params(**run_config.society_fields(config), num_agents=int(agents))
        except (ValueError, TypeError) as e:
            problems.append(f"society: {e}")
        else:
            try:
                society_encoder.check_kind(config.society.get("encoder", "reference"),
                                           sp.embed_dim)
            except ValueError as e:
                problems.append(str(e))
    if not problems and _get(config, "agents.cohorts", ()):
        try:
            cohorts.from_config(config)
        except (ValueError, TypeError, KeyError) as e:
            problems.append(str(e))
    target = str(_get(config, "train.preflight", "") or "")
    parts = target.split(":")
    need(not target or parts == ["auto"] or (len(parts) == 3 and parts[0] in ("tpu", "gpu")),
         f"train.preflight={target!r}; name a target as 'tpu:<chip>:<topology>', "
         f"'gpu:<chip>:<count>' or 'auto' (jaxsocial.scale.targets)")
    if not problems:
        problems += bound_problems(config)
    if problems:
        raise ValueError("invalid config: " + "; ".join(problems))


def bound_problems(config: ml_collections.ConfigDict) -> List[str]:
    """The config's sizes against the hard limits (`bounds.problems`: persona length, int32
    ids, the model's context), for a config whose values are otherwise consistent."""
    try:
        return bounds.problems(config)
    except ValueError as e:  # e.g. an unreadable value met while reading the limits
        return [str(e)]
