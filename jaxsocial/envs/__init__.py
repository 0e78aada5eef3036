"""jaxsocial.envs: the social-learning tournament (vectorised multi-agent bandit with a token
budget), its baselines, metrics and LLM agents; skill evolution on IFBench (`skill_evolution`,
with `ifbench` and `skill_llm` imported on demand). See docs/social_learning.md."""
from jaxsocial.envs import baselines, metrics, skill_evolution, social_learning
from jaxsocial.envs.social_learning import (
    Action,
    EnvParams,
    EnvState,
    ExploitAction,
    LearnAction,
    Observation,
    Policy,
    RoundRecord,
    exploit,
    learn,
    reset,
    rollout,
    rollout_batch,
    step,
)

__all__ = ["Action", "EnvParams", "EnvState", "ExploitAction", "LearnAction", "Observation",
           "Policy", "RoundRecord", "baselines", "exploit", "learn", "metrics", "reset", "rollout",
           "rollout_batch", "skill_evolution", "social_learning", "step"]
