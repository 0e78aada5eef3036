"""jaxsocial.generation: batched sampling from the Llama policy (see docs/generation.md)."""

from jaxsocial.generation.generate import (
    GenerationOutput,
    bucket_length,
    generate,
    generate_from_state,
)
from jaxsocial.generation.grammar import (
    Grammar,
    OneOf,
    Repeat,
    Tokens,
    accepts,
    compile_grammar,
    free_text,
    make_grammar,
    step_masks,
)
from jaxsocial.generation.sampling import SamplingConfig, sample, token_logprobs
from jaxsocial.generation.scoring import recompute_logprobs

__all__ = [
    "GenerationOutput", "bucket_length", "generate", "generate_from_state", "recompute_logprobs",
    "Grammar", "OneOf", "Repeat", "Tokens", "accepts", "compile_grammar", "free_text",
    "make_grammar", "step_masks", "SamplingConfig", "sample", "token_logprobs",
]
