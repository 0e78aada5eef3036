"""jaxsocial.social: the OASIS-style society as arrays (state, actions, recsys, crowd, metrics)."""
from jaxsocial.social.actions import (
    ActionBatch,
    ActionType,
    ApplyInfo,
    Reason,
    apply_actions,
    empty_actions,
    make_actions,
)
from jaxsocial.social.recsys import Feed, personalized_score, recommend, reddit_hot_score
from jaxsocial.social.society import StepInfo, feed, make_params, observe, reset, step
from jaxsocial.social.state import PostKind, ReactionKind, SocialParams, SocialState

__all__ = [
    "ActionBatch", "ActionType", "ApplyInfo", "Feed", "PostKind", "ReactionKind", "Reason",
    "SocialParams", "SocialState", "StepInfo", "apply_actions", "empty_actions", "feed",
    "make_actions", "make_params", "observe", "personalized_score", "recommend",
    "reddit_hot_score", "reset", "step",
]
