"""Hard limits a Social-RL config's sizes must stay within, checked from the config alone.

`problems(config)` returns one line per broken limit, each naming its `--config.` key; it is part
of `train.checks.check`, so such a config is refused before anything is built or a workdir is
written. The limits hold on any machine: a persona's length (`MAX_PERSONA_TOKENS`), the int32
post slots (`MAX_ID`) and the model's context (`rollout.max_new_tokens` must leave a prompt
room). Whether a run fits this machine's memory is `train.fit`'s question.

Token counts are exact with the run's tokenizer when its `tokenizer.json` is at hand (a preset's
tiny tokenizer, an HF checkpoint directory, `--config.tokenizer`), read with the `tokenizers`
library (~30 ms, no transformers import); otherwise (a GGUF checkpoint) an upper bound: one
token per UTF-8 byte plus one.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, List, Optional, Tuple

from jaxsocial.train import config as run_config

MAX_PERSONA_TOKENS = 2048
"""Longest persona, in tokens of the run's tokenizer (" " + persona, as the text bank tokenizes
it). A persona is the system message of every prompt the agent gets, and the set-up's text-bank
pass pads every interest description and persona to the longest one, so one long persona makes
every prompt and every text-bank row that long (attention memory grows with its square).
2048 tokens is about 8 KB of English text for Llama-3's tokenizer (about 3 KB for the tiny
byte-level one), a hundred times the shipped personas (about 20 tokens); longer personas are
refused."""

MAX_ID = 2 ** 31 - 1
"""Largest society size an int32 id can address: post ids and slots (`society.post_capacity`)
and user ids are int32 (`social.state`); `SocialParams.validate` bounds num_users tighter
(num_users * 8 < 2**31)."""

_get = run_config.config_get


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str):
    import tokenizers  # the fast tokenizers' own library: no transformers import
    return tokenizers.Tokenizer.from_file(path)


def _tokenizer_json(config) -> Optional[str]:
    """The run's tokenizer.json when it is a local file (None: a GGUF or unknown tokenizer)."""
    tok = str(_get(config, "tokenizer", "") or "")
    ckpt = str(_get(config, "model.checkpoint", "") or "")
    if tok:
        candidates = [tok, os.path.join(tok, "tokenizer.json")]
    elif ckpt:
        candidates = [os.path.join(ckpt, "tokenizer.json")]
    else:
        from jaxsocial.models import tokenizer as tiny
        candidates = [os.path.join(tiny.tiny_tokenizer_path(), "tokenizer.json")]
    return next((p for p in candidates if p.endswith(".json") and os.path.isfile(p)), None)


def token_counter(config) -> Tuple[Callable[[str], int], bool]:
    """(count, exact): count(text) = tokens of `text` (no special tokens added) with the run's
    tokenizer when its tokenizer.json is at hand (exact), else UTF-8 bytes + 1 (an upper bound
    for byte-level BPE and byte-fallback tokenizers)."""
    path = _tokenizer_json(config)
    if path is not None:
        try:
            tk = _tokenizer(path)
            return (lambda s: len(tk.encode(s, add_special_tokens=False).ids) if s else 0), True
        except Exception:  # noqa: BLE001 -- unreadable: fall back to the bound
            pass
    return (lambda s: len(s.encode("utf-8")) + 1 if s else 0), False


def model_config(config):
    """The run's `LlamaConfig` from the config alone (`loading.load_config`: `model.preset`, or
    the checkpoint's config.json / GGUF header, with the config's dtypes and switches). None
    when the checkpoint cannot be read here (its loader then says why)."""
    from jaxsocial.models import loading

    ckpt = str(config.model.get("checkpoint", "") or "")
    if ckpt and not os.path.exists(ckpt):
        return None
    try:
        return loading.load_config(**run_config.model_args(config))
    except Exception:  # noqa: BLE001 -- the loader reports an unreadable checkpoint
        return None


def _model_name(config) -> str:
    m = config.model
    return f"model.checkpoint={m.checkpoint!r}" if m.get("checkpoint", "") else \
        f"model.preset={m.preset!r}"


def problems(config) -> List[str]:
    """One-line problems of `config` against the hard limits; [] when it keeps them, or when
    the config is not a Social-RL one."""
    if not all(k in config for k in ("agents", "society", "rollout", "model")):
        return []
    out = []
    count, exact = token_counter(config)
    personas = list(_get(config, "agents.personas", ()) or ())
    personas = personas[:max(1, int(_get(config, "agents.num_agents", 1)))]
    longest = max((count(" " + p) for p in personas), default=0)
    if longest > MAX_PERSONA_TOKENS:
        how = "" if exact else " (UTF-8 bytes + 1, a bound: no tokenizer.json at hand)"
        out.append(f"agents.personas: the longest persona is {longest} tokens{how}, more "
                   f"than bounds.MAX_PERSONA_TOKENS={MAX_PERSONA_TOKENS} (every prompt and "
                   f"text-bank row is padded to it); shorten it")
    capacity = int(config.society.post_capacity)
    if capacity > MAX_ID:
        out.append(f"society.post_capacity={capacity} exceeds the int32 post slots "
                   f"(at most {MAX_ID})")
    new = int(config.rollout.max_new_tokens)
    cfg = model_config(config)
    context = int(getattr(cfg, "max_position_embeddings", 0) or 0)
    if context and new >= context:
        out.append(f"rollout.max_new_tokens={new} leaves no room for a prompt in the model's "
                   f"context ({_model_name(config)}: max_position_embeddings={context}); "
                   f"lower it below {context}")
    return out
