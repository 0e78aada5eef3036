"""Settings PPO and GRPO share: the optimizer, the update's structure, the clipped surrogate,
the KL to the reference, the response rules and the sampling distribution.

`OptimConfig` is the base of `ppo.PPOConfig` and `grpo.GRPOConfig`; each adds its own
advantage / loss settings. `config_fields` lists the fields a run config may set (everything
except what the loop takes from the tokenizer and the rollout), which is how
`jaxsocial/train/loop.py` maps `c.rl` onto these dataclasses under their own field names.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ml_collections import config_dict

KL_ESTIMATORS = ("k1", "k2", "k3")
OLD_LOGPROBS = ("auto", "rollout", "rescore")
LR_SCHEDULES = ("constant", "cosine")

# Set by the training loop from the tokenizer and `c.rollout`, not from `c.rl`.
ROLLOUT_FIELDS = ("stop_token_ids", "temperature", "top_k", "top_p")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Shared PPO / GRPO knobs (defaults: docs/rl.md, "Defaults"; subclasses override some)."""

    # optimizer: optax.chain(clip_by_global_norm(max_grad_norm), adamw(schedule))
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


# ----------------------------------------------------------------------------------------------
# The run config's `rl` block (jaxsocial/train/defaults.py, loop._rl_config)

# Old `c.rl` names kept as aliases (ml_collections FieldReferences to the same value).
ALIASES = {"lr": "learning_rate", "minibatches": "num_minibatches", "entropy_coef": "ent_coef"}
# Set by the loop from elsewhere in the config, never from `c.rl`.
LOOP_SET = {"stop_token_ids": "the tokenizer's stop tokens", "temperature": "rollout.temperature",
            "top_k": "rollout.top_k", "top_p": "rollout.top_p",
            "reward_norm": "reward.normalize"}


def _algo_classes():
    from jaxsocial.rl import grpo, ppo  # a real cycle: both import this module
    return {"ppo": ppo.PPOConfig, "grpo": grpo.GRPOConfig}


def run_config_fields() -> dict:
    """{name: default} of every PPOConfig / GRPOConfig field a run config sets under its own
    name: the shared OptimConfig fields (PPO's defaults), then PPO's and GRPO's own."""
    classes = _algo_classes()
    out = config_fields(classes["ppo"], [n for n in base_field_names() if n not in LOOP_SET])
    for cls in classes.values():
        out.update(config_fields(cls, [n for n in specific_field_names(cls)
                                       if n not in LOOP_SET]))
    return out


def add_aliases(rl) -> None:
    """Make `rl.lr`, `rl.minibatches`, `rl.entropy_coef` references to their fields (an
    ml_collections ConfigDict: setting either name sets both)."""
    for alias, name in ALIASES.items():
        rl[alias] = rl.get_ref(name)


def from_run_config(rl, *, loop_keys=(), **fixed):
    """Build the PPOConfig / GRPOConfig of `rl["algo"]` from a run config's `rl` block.

    rl: mapping with "algo" and any fields of `run_config_fields()` (or their ALIASES);
    loop_keys: other keys the caller reads itself (value_mode, lora_rank, ...); fixed: values
    the caller sets from elsewhere (stop_token_ids, temperature, ...; ignored when the class
    lacks the field). Raises one ValueError naming every unknown key, or an alias that
    disagrees with its field; the dataclass checks the values.
    """
    rl = dict(rl)
    classes = _algo_classes()
    algo = rl.get("algo", "ppo")
    if algo not in classes:
        raise ValueError(f"rl.algo={algo!r}; choose one of {sorted(classes)}")
    fields = run_config_fields()
    known = set(fields) | set(ALIASES) | set(loop_keys) | {"algo"}
    unknown = sorted(set(rl) - known)
    if unknown:
        hints = [f"rl.{k} (set by {LOOP_SET[k]})" if k in LOOP_SET else f"rl.{k}"
                 for k in unknown]
        raise ValueError(f"unknown config key(s) {', '.join(hints)}; the rl block takes the "
                         f"fields of PPOConfig / GRPOConfig under their own names (docs/rl.md)")
    for alias, name in ALIASES.items():
        if alias in rl and name in rl and rl[alias] != rl[name]:
            raise ValueError(f"rl.{alias}={rl[alias]!r} disagrees with rl.{name}={rl[name]!r} "
                             f"(rl.{alias} is an alias of rl.{name}: set one)")
        if alias in rl and name not in rl:
            rl[name] = rl[alias]
    cls = classes[algo]
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in rl.items() if k in names}
    kwargs.update({k: v for k, v in fixed.items() if k in names})
    return cls(**kwargs)
