"""The RL algorithms' settings: `OptimConfig` (what PPO and GRPO share: the optimizer, the
update's structure, the clipped surrogate, the KL to the reference, the response rules and the
sampling distribution), `PPOConfig` (the critic, GAE and the KL controller) and `GRPOConfig`
(group advantages, loss aggregation). Frozen dataclasses: each checks its values when built.

`config_fields` lists the fields a run config may set (everything except what the loop takes
from the tokenizer and the rollout); `jaxsocial.train.config` maps a run's `c.rl` block onto
these classes under their own field names.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ml_collections import config_dict

KL_ESTIMATORS = ("k1", "k2", "k3")
OLD_LOGPROBS = ("auto", "rollout", "rescore")
OLD_VALUES = ("rescore", "rollout")
LR_SCHEDULES = ("constant", "cosine")
REWARD_NORMS = ("none", "running")
KL_PER = ("token", "sequence")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean")

# Set by the training loop from the tokenizer and `c.rollout`, not from `c.rl`.
ROLLOUT_FIELDS = ("stop_token_ids", "temperature", "top_k", "top_p")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Shared PPO / GRPO knobs (defaults: docs/rl.md, "Defaults"; subclasses override some)."""

    # optimizer: optax.chain(clip_by_global_norm(max_grad_norm), adamw(schedule)), the
    # schedule's peak (learning_rate) held in the train state (rl/optim.py)
    learning_rate: float = 3e-6
    lr_schedule: str = "constant"        # "constant" (after warmup) or "cosine"
    warmup_steps: int = 0
    decay_steps: int = 10_000            # cosine only: optimizer steps from peak to end
    end_lr_ratio: float = 0.0            # cosine only: final lr = ratio * learning_rate
    weight_decay: float = 0.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    # update structure: epochs x minibatches x (micro-batches accumulated per optimizer step)
    ppo_epochs: int = 4
    num_minibatches: int = 1
    grad_accum_steps: int = 1
    micro_batch: int = 0                 # rows per micro-batch; 0 = minibatch / grad_accum_steps
    logits_chunk: int = 0                # response positions per log-prob chunk; 0 = auto
    # old log-probs: "auto" = the rollout's own when exact (float32 compute), else re-scored;
    # "rollout" = always the rollout's; "rescore" = always a policy forward (policy.score_batch)
    old_logprobs: str = "auto"
    # rows in contiguous groups of this many share one prompt (GRPO's samples of a prompt):
    # the prompt's forward runs once per group, checked at run time (0 = off; scoring.py)
    prompt_group: int = 0
    # clipped surrogate and entropy bonus
    clip_eps: float = 0.2
    clip_eps_high: Optional[float] = None  # None = symmetric; 0.28 = DAPO clip-higher
    ent_coef: float = 0.0
    # KL to the reference (PPO: in the reward; GRPO: in the loss)
    kl_coef: float = 0.05                # with PPO's adaptive_kl: the controller's start
    kl_estimator: str = "k1"
    # responses
    missing_stop_penalty: float = 0.0    # subtracted from the score if no stop token
    stop_token_ids: tuple = ()
    # sampling distribution: must equal the rollout's so the first ratio is 1
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        stops = self.stop_token_ids
        stops = (stops,) if isinstance(stops, int) else stops
        # a tuple of ints keeps the frozen config hashable (it is a static jit argument)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stops))
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule={self.lr_schedule!r}; choose one of {LR_SCHEDULES}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator={self.kl_estimator!r}; choose one of "
                             f"{KL_ESTIMATORS}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"old_logprobs={self.old_logprobs!r}; choose one of {OLD_LOGPROBS}")
        if int(self.prompt_group) < 0 or int(self.prompt_group) == 1:
            raise ValueError(f"prompt_group must be 0 (off) or >= 2, got {self.prompt_group}")
        for name in ("ppo_epochs", "num_minibatches", "grad_accum_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("micro_batch", "logits_chunk"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = automatic), got "
                                 f"{getattr(self, name)}")
        if self.micro_batch and self.grad_accum_steps != 1:
            raise ValueError(f"set micro_batch ({self.micro_batch}) or grad_accum_steps "
                             f"({self.grad_accum_steps}), not both: micro_batch fixes the "
                             f"accumulation steps")
        if not 0.0 < self.clip_eps < 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and self.clip_eps_high <= 0:
            raise ValueError(f"clip_eps_high must be > 0, got {self.clip_eps_high}")
        if not self.learning_rate >= 0:  # 0: a frozen policy (a study's control arm)
            raise ValueError(f"learning_rate must be >= 0 (0 = a frozen policy), got "
                             f"{self.learning_rate}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 for RL (log-probs of greedy decoding "
                             f"are not defined), got {self.temperature}")

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)

    def accumulation(self, batch_rows: int) -> tuple[int, int]:
        """-> (grad_accum_steps, rows per micro-batch) for a batch of `batch_rows` rows.

        Raises ValueError naming the setting that does not divide the batch.
        """
        n = int(self.num_minibatches)
        if batch_rows % n:
            raise ValueError(f"batch size {batch_rows} is not divisible by num_minibatches={n}")
        mb = batch_rows // n
        if self.micro_batch:
            if mb % self.micro_batch:
                raise ValueError(f"micro_batch={self.micro_batch} does not divide the minibatch "
                                 f"of {mb} rows (batch {batch_rows} / num_minibatches {n})")
            return mb // self.micro_batch, int(self.micro_batch)
        k = int(self.grad_accum_steps)
        if mb % k:
            raise ValueError(f"batch size {batch_rows} is not divisible by num_minibatches x "
                             f"grad_accum_steps = {n} x {k}")
        return k, mb // k


def base_field_names() -> tuple:
    """Field names of OptimConfig a run config sets (ROLLOUT_FIELDS excluded)."""
    return tuple(f.name for f in dataclasses.fields(OptimConfig)
                 if f.name not in ROLLOUT_FIELDS)


def specific_field_names(cls) -> tuple:
    """Fields `cls` (PPOConfig / GRPOConfig) adds to OptimConfig."""
    base = {f.name for f in dataclasses.fields(OptimConfig)}
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in base)


def config_fields(cls=OptimConfig, names=None) -> dict:
    """{name: default} of `cls`'s fields `names` (default: the shared base fields), with
    Optional defaults (None) as typed ml_collections placeholders so that `--config.rl.x=...`
    can set them from the command line."""

    names = base_field_names() if names is None else names
    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in names:
            continue
        value = f.default
        if value is None:
            value = config_dict.placeholder(float)
        out[f.name] = value
    return out


@dataclasses.dataclass(frozen=True)
class PPOConfig(OptimConfig):
    """PPO knobs (TRL-style token-level PPO; defaults: docs/rl.md, "Defaults"). The optimizer,
    update structure, surrogate, KL and sampling fields come from `OptimConfig`."""

    # old values (value_mode "head", old log-probs from the rollout): "rescore" = the policy
    # trunk's forward in the scoring pass; "rollout" = the generator's hidden state that sampled
    # each token through the value head (`policy.score_batch(rollout_values=...)`): the same
    # values to float rounding, and one forward fewer per epoch
    old_values: str = "rescore"
    # value loss
    value_clip: float = 0.2
    vf_coef: float = 0.1
    # advantages
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    whiten_rewards: bool = False
    reward_norm: str = "none"            # "running": divide scores by a running std
    reward_clip: Optional[float] = None  # clip (normalised) scores to [-c, c]
    # KL in the reward: "token" = -kl_coef * kl_t on every token (a sequence pays its summed
    # KL, so short answers pay less); "sequence" = one term -kl_coef * mean_t kl_t at the last
    # token (every answer pays its mean per-token KL, whatever its length)
    kl_per: str = "token"
    # adaptive KL controller (Ziegler et al. 2019); it starts from kl_coef
    adaptive_kl: bool = False
    adaptive_kl_init: Optional[float] = None  # None: start from kl_coef (an explicit start)
    kl_target: float = 6.0
    kl_horizon: float = 10_000.0

    def __post_init__(self):
        super().__post_init__()
        if self.reward_norm not in REWARD_NORMS:
            raise ValueError(f"reward_norm={self.reward_norm!r}; choose one of {REWARD_NORMS}")
        if self.kl_per not in KL_PER:
            raise ValueError(f"kl_per={self.kl_per!r}; choose one of {KL_PER}")
        if self.old_values not in OLD_VALUES:
            raise ValueError(f"old_values={self.old_values!r}; choose one of {OLD_VALUES}")
        if self.value_clip <= 0:
            raise ValueError(f"value_clip must be > 0, got {self.value_clip}")
        if not 0.0 <= self.lam <= 1.0 or not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if self.adaptive_kl and self.kl_coef <= 0 and self.adaptive_kl_init is None:
            raise ValueError(f"adaptive_kl starts from kl_coef, which must be > 0 "
                             f"(a multiplicative controller cannot leave 0), got {self.kl_coef}")

    @property
    def initial_kl_coef(self) -> float:
        if self.adaptive_kl and self.adaptive_kl_init is not None:
            return self.adaptive_kl_init
        return self.kl_coef


@dataclasses.dataclass(frozen=True)
class GRPOConfig(OptimConfig):
    """GRPO knobs (defaults: docs/rl.md, "Defaults"). The optimizer, update structure, surrogate, KL
    and sampling fields come from `OptimConfig` (GRPO's own defaults below)."""

    # shared fields with GRPO defaults (1 epoch: one gradient step per fresh batch, as TRL)
    learning_rate: float = 1e-6
    ppo_epochs: int = 1
    kl_coef: float = 0.0                  # KL in the loss, not in the reward
    kl_estimator: str = "k3"
    temperature: float = 1.0
    # GRPO's own
    group_size: int = 8
    loss_aggregation: str = "token_mean"  # "seq_mean": per-sequence mean, then batch mean
    scale_rewards: bool = True            # False: Dr. GRPO (no division by the group std)
    std_eps: float = 1e-4
    std_ddof: int = 1                     # 1 = unbiased group std (torch.std, as TRL)

    def __post_init__(self):
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2, got {self.group_size}")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"loss_aggregation={self.loss_aggregation!r}; choose one of "
                             f"{LOSS_AGGREGATIONS}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")

    adaptive_kl = False

    @property
    def initial_kl_coef(self) -> float:
        return self.kl_coef
