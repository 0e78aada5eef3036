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
from jaxsocial.train import bounds, cohorts, dataset, society_encoder
from jaxsocial.train import config as run_config

_get = run_config.config_get


class _Problems:
    """The problems found so far in one config, and the readers that add to them."""

    def __init__(self, config: ml_collections.ConfigDict):
        self.config, self.list = config, []

    def get(self, key, default=None):
        return _get(self.config, key, default)

    def need(self, ok: bool, msg: str):
        if not ok:
            self.list.append(msg)

    def num(self, key, default=0):
        v = self.get(key, default)
        try:
            return float(v)
        except (TypeError, ValueError):
            self.list.append(f"{key}={v!r} is not a number")
            return default

    def at_least(self, key, lo, default):
        self.need(self.num(key, default) >= lo, f"{key}={self.get(key)} must be >= {lo}")

    def attempt(self, fn, errors, prefix=""):
        """Run fn(); an error of `errors` becomes a problem (its message after `prefix`)."""
        try:
            return fn()
        except errors as e:
            self.list.append(f"{prefix}{e}")


def check(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError naming every inconsistent `--config.` value (cheap: nothing is built,
    JAX's backend is not started). The sections' checks run in order; the ones that build
    something (the society's params, the cohorts, the hard limits) only on a config that is
    consistent so far."""
    p = _Problems(config)
    epochs = _train_keys(p)
    _reward_and_algo(p)
    agents = _agents(p)
    _rollout_and_model(p)
    _agent_texts(p, epochs)
    if not p.list:
        _built(p, agents)
    target = str(p.get("train.preflight", "") or "")
    parts = target.split(":")
    p.need(not target or parts == ["auto"] or (len(parts) == 3 and parts[0] in ("tpu", "gpu")),
           f"train.preflight={target!r}; name a target as 'tpu:<chip>:<topology>', "
           f"'gpu:<chip>:<count>' or 'auto' (jaxsocial.scale.targets)")
    if not p.list:
        p.list += bound_problems(config)
    if p.list:
        raise ValueError("invalid config: " + "; ".join(p.list))


def _train_keys(p: _Problems) -> float:
    """train.* and the feed's sizes; returns train.epochs."""
    epochs = p.num("train.epochs", 1)
    p.need(epochs >= 1 and epochs == int(epochs), f"train.epochs={p.get('train.epochs')} "
           f"must be an integer >= 1")
    p.at_least("train.checkpoint_every", 1, 1)
    p.at_least("train.keep_checkpoints", 1, 1)
    p.at_least("train.log_samples", 0, 0)
    if p.get("train.dataset", False):
        p.need(dataset.missing() is None, str(dataset.missing()))
    feed, pool = p.num("society.feed_size", 1), p.num("society.pool_size", 1)
    p.need(feed >= 1, f"society.feed_size={int(feed)} must be >= 1")
    p.need(feed <= pool, f"society.feed_size={int(feed)} > society.pool_size={int(pool)}: the "
           f"feed is chosen from the candidate pool, so feed_size must be <= pool_size")
    return epochs


def _reward_and_algo(p: _Problems) -> None:
    """reward.* and the algorithm's choices that depend on it (rl.algo, rl.kl_per)."""
    mode = p.get("reward.normalize", "none")
    p.need(mode in NORMALIZE_MODES, f"reward.normalize={mode!r}; choose one of "
           f"{', '.join(NORMALIZE_MODES)}")
    p.at_least("reward.horizon", 1, 1)
    algo = p.get("rl.algo", "ppo")
    p.need(algo in ("ppo", "grpo"), f"rl.algo={algo!r}; choose 'ppo' or 'grpo'")
    p.need(not (mode == "running" and algo == "grpo"), "reward.normalize='running' is done by "
           "the PPO update (rl.algo='ppo'); GRPO already normalises within each group")
    npm = p.get("reward.non_post_mode", "constant")
    p.need(npm in NON_POST_MODES, f"reward.non_post_mode={npm!r}; choose one of "
           f"{', '.join(NON_POST_MODES)}")
    p.need(p.get("reward.non_post_baseline", None) is None,
           "reward.non_post_baseline is no longer a key: use reward.non_post_mode='mean' (the "
           "epoch's mean post score), 'constant' (reward.non_post) or 'skip'")
    kl_per = p.get("rl.kl_per", "token")
    p.need(kl_per in KL_PER, f"rl.kl_per={kl_per!r}; choose one of {KL_PER}")
    p.need(not (kl_per != "token" and algo == "grpo"), f"rl.kl_per={kl_per!r} shapes PPO's KL "
           f"penalty in the reward; GRPO charges its KL in the loss (rl.kl_coef, "
           f"rl.loss_aggregation): leave rl.kl_per='token'")


def _agents(p: _Problems) -> float:
    """agents.* (action mode, counts, activation) and society.num_users; returns
    agents.num_agents."""
    amode = p.get("agents.action_mode", "constrained")
    p.need(amode in ("constrained", "free", "tool_call"),
           f"agents.action_mode={amode!r}; choose 'constrained', 'free' or 'tool_call'")
    agents = p.num("agents.num_agents", 1)
    p.need(agents >= 1, f"agents.num_agents={int(agents)} must be >= 1")
    active = p.num("agents.active_per_tick", 0)
    p.need(0 <= active <= agents, f"agents.active_per_tick={int(active)} must be in "
           f"[0, agents.num_agents={int(agents)}] (0 = all)")
    if p.get("agents.activation.enabled", False):
        p.need(0 < active < agents, f"agents.activation.enabled needs 0 < "
               f"agents.active_per_tick < agents.num_agents={int(agents)} (got {int(active)}): "
               f"the activation profile decides which of the agents act each tick")
        amp = p.num("agents.activation.diurnal_amplitude", 0.0)
        p.need(0 <= amp < 1, f"agents.activation.diurnal_amplitude={amp} must be in [0, 1)")
        p.at_least("agents.activation.sigma", 0, 0.0)
        p.at_least("agents.activation.peak_spread", 0, 0.0)
    users = p.num("society.num_users", agents)
    p.need(users >= agents, f"society.num_users={int(users)} < agents.num_agents={int(agents)}")
    return agents


def _rollout_and_model(p: _Problems) -> None:
    """rollout.*, the update's counts and model.checkpoint."""
    p.at_least("rollout.ticks_per_epoch", 1, 1)
    p.at_least("rollout.max_new_tokens", 1, 1)
    buckets, new = p.num("rollout.decode_buckets", 1), int(p.num("rollout.max_new_tokens", 1))
    p.need(1 <= buckets <= new, f"rollout.decode_buckets={p.get('rollout.decode_buckets')} "
           f"must be in [1, {new}] (at most one decode segment per new token)")
    p.at_least("rollout.temperature", 0, 1.0)
    if p.get("rollout.tool_call_temperature") is not None:
        p.at_least("rollout.tool_call_temperature", 0, 1.0)
    p.at_least("rl.num_minibatches", 1, 1)
    p.at_least("rl.ppo_epochs", 1, 1)
    p.at_least("rl.learning_rate", 0, 0.0)
    p.need(not (p.get("model.require_checkpoint", False) and not p.get("model.checkpoint", "")),
           f"model.checkpoint is empty but config {p.get('name', '?')!r} needs one "
           f"(--config.model.checkpoint=/path/to/a Hugging Face Llama, Mistral, Qwen2 or Qwen3 "
           f"directory, or a Llama .gguf; for a CPU run without weights use "
           f"--config=configs/demo.py)")


def _agent_texts(p: _Problems, epochs: float) -> None:
    """What the agents read and are asked: comment actions against the feed, interviews,
    personas and names."""
    config = p.config
    if "agents" in config and "actions" in config.agents:
        def comments():
            comment_actions = actions.needs_comments(config.agents.actions)
            p.need(not comment_actions or p.num("society.feed_comments", 0) >= 1,
                   f"agents.actions {list(comment_actions)} name a shown comment: set "
                   f"society.feed_comments >= 1")
        p.attempt(comments, ValueError)
    for item in p.get("agents.interviews", ()) or ():
        ok = (isinstance(item, (tuple, list)) and len(item) == 2
              and isinstance(item[1], str) and item[1].strip())
        try:
            ok = ok and 1 <= int(item[0]) <= int(epochs) and int(item[0]) == item[0]
        except (TypeError, ValueError):
            ok = False
        p.need(bool(ok), f"agents.interviews: {item!r} must be (epoch, question) with an "
               f"integer epoch in [1, train.epochs={int(epochs)}] and a non-empty question")
    if "agents" in config:
        for key, what in (("agents.personas", "persona"), ("agents.names", "name")):
            texts = p.get(key, ())
            if key == "agents.names" and not texts:
                continue  # () = the names in the personas
            p.attempt(lambda: text_bank.check_texts(texts, key, what), ValueError)


def _built(p: _Problems, agents: float) -> None:
    """The checks that build something from the config (the activation profile, the society's
    params and encoder, the cohorts), each only while no problem is found."""
    config = p.config
    if p.get("agents.activation.enabled", False):
        # the profile against agents.active_per_tick over the hours the run's ticks reach
        p.attempt(lambda: activation.check_config(config), (ValueError, FileNotFoundError))
    if not p.list and "society" in config:
        sp = p.attempt(lambda: society.make_params(**run_config.society_fields(config),
                                                   num_agents=int(agents)),
                       (ValueError, TypeError), prefix="society: ")
        if sp is not None:
            p.attempt(lambda: society_encoder.check_kind(config.society.get("encoder",
                                                                            "reference"),
                                                         sp.embed_dim), ValueError)
    if not p.list and p.get("agents.cohorts", ()):
        p.attempt(lambda: cohorts.from_config(config), (ValueError, TypeError, KeyError))


def bound_problems(config: ml_collections.ConfigDict) -> List[str]:
    """The config's sizes against the hard limits (`bounds.problems`: persona length, int32
    ids, the model's context), for a config whose values are otherwise consistent."""
    try:
        return bounds.problems(config)
    except ValueError as e:  # e.g. an unreadable value met while reading the limits
        return [str(e)]
