"""jaxsocial.rl: PPO and GRPO for the Llama policy, as pure jitted functions (docs/rl.md)."""

from jaxsocial.rl.buffer import Trajectory, make_trajectory
from jaxsocial.rl.grpo import GRPOConfig, group_advantages
from jaxsocial.rl.lora import LoraConfig
from jaxsocial.rl.optim import init_train_state
from jaxsocial.rl.policy import PolicyDef, init_policy, score_batch
from jaxsocial.rl.ppo import PPOConfig, compute_gae
from jaxsocial.rl.state import TrainState

__all__ = [
    "Trajectory", "make_trajectory", "GRPOConfig", "group_advantages", "LoraConfig",
    "PolicyDef", "init_policy", "score_batch", "PPOConfig", "compute_gae", "init_train_state",
    "TrainState",
]
