"""One way to load a policy: `load(path_or_preset) -> (model, tokenizer, stop_ids)`.

Used by the training loop and the chat engine (`jaxsocial.agents.chat.ChatModel`: the tournament's
LLM agents, skill evolution and the lm-eval model), so all of them read checkpoints, pick
tokenizers and stop generation by the same rule:

- a path (a Hugging Face directory of any supported family: llama, mistral, qwen2, qwen3; a
  llama `.gguf` file or a directory holding one) is read by `checkpoint_hf.from_pretrained`,
  its tokenizer by `checkpoint_hf.load_tokenizer`;
- a preset name (`llama.PRESETS`: 'tiny', 'small_20m', ...) is a randomly initialised model
  (`seed`) with the committed tiny tokenizer unless `tokenizer` is given;
- stop ids (`stop_token_ids`) = the tokenizer's eos + the chat template's end-of-turn token +
  the model config's own eos ids.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import numpy as np
from flax import nnx

from jaxsocial.models import checkpoint_hf, llama
from jaxsocial.models.tokenizer import tiny_tokenizer

_MARK = "Zq7"  # assistant content whose right neighbour in the chat template ends the turn


def end_of_turn_id(tokenizer) -> Optional[int]:
    """The special token the chat template puts right after an assistant message
    (`<|eot_id|>` for Llama-3, `<|im_end|>` for ChatML), or None without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}],
        tokenize=False)
    after = text[text.rfind(_MARK) + len(_MARK):]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    if not ids:
        return None
    first = int(ids[0])
    added = getattr(tokenizer, "added_tokens_decoder", {}).get(first)
    if first in set(tokenizer.all_special_ids) or (added is not None and added.special):
        return first
    return None


def stop_token_ids(tokenizer, config: Optional[llama.LlamaConfig] = None) -> Tuple[int, ...]:
    """Sorted stop ids: the tokenizer's eos, the chat template's end-of-turn token and the
    model config's eos ids (`config.eos_token_ids`, when a config is given)."""
    ids = set(config.eos_token_ids) if config is not None else set()
    for i in (tokenizer.eos_token_id, end_of_turn_id(tokenizer)):
        if i is not None:
            ids.add(int(i))
    if not ids:
        raise ValueError("the tokenizer has no eos token and no chat template, and no model "
                         "config was given: nothing would stop generation")
    return tuple(sorted(int(i) for i in ids))


def load(path_or_preset: str, dtype: Any = None, param_dtype: Any = None, *,
         tokenizer: Any = None, seed: int = 0,
         remat: Optional[bool] = None,
         attention_chunk: Optional[int] = None,
         scan_layers: Optional[bool] = None) -> Tuple[llama.Llama, Any, Tuple[int, ...]]:
    """-> (model, tokenizer, stop_ids).

    path_or_preset: a checkpoint path (HF directory, `.gguf` file or a directory holding one)
    or a `llama.PRESETS` name (random init from `seed`). dtype / param_dtype: compute and
    storage dtypes (`checkpoint_hf.from_pretrained`'s defaults for a path; the preset's
    otherwise). tokenizer: a tokenizer object or a path to load one from (default: the
    checkpoint's own; the tiny tokenizer for a preset). remat / attention_chunk: override
    `config.remat` / `config.attention_chunk` (queries per attention block; 0 = all);
    scan_layers: override `config.scan_layers` (the layers as one `lax.scan`).
    Raises ValueError naming the value when it is neither, when the checkpoint holds a NaN or
    inf weight (naming the first such tensor), or when the tokenizer's vocabulary does not fit
    the model's embedding.
    """
    model = load_model(path_or_preset, dtype, param_dtype, seed=seed, remat=remat,
                       attention_chunk=attention_chunk, scan_layers=scan_layers)
    tokenizer = resolve_tokenizer(tokenizer if tokenizer is not None else
                                  default_tokenizer(path_or_preset), model.config)
    return model, tokenizer, stop_token_ids(tokenizer, model.config)


def _is_preset(path_or_preset: str) -> bool:
    if not path_or_preset:
        raise ValueError("nothing to load: give a checkpoint path or a preset name "
                         f"({', '.join(sorted(llama.PRESETS))})")
    if path_or_preset in llama.PRESETS and not os.path.exists(path_or_preset):
        return True
    if os.path.exists(path_or_preset) or os.sep in str(path_or_preset) or str(
            path_or_preset).endswith(".gguf"):
        return False  # a path: from_pretrained names a missing or unreadable one in its error
    raise ValueError(f"{path_or_preset!r} is neither an existing checkpoint path nor a "
                     f"preset ({', '.join(sorted(llama.PRESETS))})")


def default_tokenizer(path_or_preset: str):
    """The checkpoint's own tokenizer (its path); None (the tiny tokenizer) for a preset."""
    return None if _is_preset(path_or_preset) else path_or_preset


def _switches(config: llama.LlamaConfig, remat, attention_chunk, scan_layers):
    if remat is not None:
        config = config.replace(remat=bool(remat))
    if attention_chunk is not None:
        if int(attention_chunk) < 0:
            raise ValueError(f"attention_chunk={attention_chunk} must be >= 0 (0 = all queries "
                             f"at once)")
        config = config.replace(attention_chunk=int(attention_chunk))
    if scan_layers is not None:
        config = config.replace(scan_layers=bool(scan_layers))
    return config


def load_model(path_or_preset: str, dtype: Any = None, param_dtype: Any = None, *,
               seed: int = 0, remat: Optional[bool] = None,
               attention_chunk: Optional[int] = None,
               scan_layers: Optional[bool] = None) -> llama.Llama:
    """The model of `load` (same arguments), without a tokenizer."""
    if _is_preset(path_or_preset):
        kw = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype),
                                ("remat", remat)) if v is not None}
        model = llama.Llama(llama.preset(path_or_preset, **kw), rngs=nnx.Rngs(int(seed)))
    else:
        model = checkpoint_hf.from_pretrained(path_or_preset, dtype=dtype,
                                              param_dtype=param_dtype)
        # NaN/inf weights would train to NaN metrics and export a NaN model without a word.
        checkpoint_hf.check_finite(model, f"checkpoint {path_or_preset!r}")
    model.config = _switches(model.config, remat, attention_chunk, scan_layers)
    return model


def load_config(path_or_preset: str, dtype: Any = None, param_dtype: Any = None, *,
                remat: Optional[bool] = None, attention_chunk: Optional[int] = None,
                scan_layers: Optional[bool] = None) -> llama.LlamaConfig:
    """The `LlamaConfig` `load_model` gives for the same arguments, read without weights: the
    preset, or the checkpoint's config.json / GGUF header with the loader's dtypes."""
    if _is_preset(path_or_preset):
        kw = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype),
                                ("remat", remat)) if v is not None}
        config = llama.preset(path_or_preset, **kw)
    else:
        from jaxsocial.models import gguf, hf_layout

        found = gguf.find_gguf(path_or_preset)
        config = (gguf.config_from_gguf(found) if found is not None else
                  checkpoint_hf.config_from_hf(path_or_preset))
        dtype, param_dtype = hf_layout.default_dtypes(dtype, param_dtype)
        config = config.replace(dtype=dtype, param_dtype=param_dtype)
    return _switches(config, remat, attention_chunk, scan_layers)


def resolve_tokenizer(tokenizer: Any, config: llama.LlamaConfig):
    """A tokenizer object (returned as is), a path to load one from, or None (the committed
    tiny tokenizer). Raises ValueError when its vocabulary does not fit `config`'s embedding."""
    if tokenizer is None:
        tokenizer = tiny_tokenizer()
    elif isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = checkpoint_hf.load_tokenizer(tokenizer, config)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the model's embedding has "
                         f"{config.vocab_size} rows")
    return tokenizer


def encode_chats(tokenizer: Any, conversations, pad: int):
    """Chat-templated conversations (each a list of {"role", "content"} messages, the
    generation prompt added) -> left-padded (ids [B, L] int32, mask [B, L] int32)."""
    rows = []
    for messages in conversations:
        enc = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                            tokenize=True)
        rows.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for b, r in enumerate(rows):
        ids[b, length - len(r):] = r
        mask[b, length - len(r):] = 1
    return ids, mask


def chat_token_ids(tokenizer: Any, config: llama.LlamaConfig) -> Tuple[Tuple[int, ...], int, int]:
    """(stop ids, end-of-turn id, pad id) of a chat model: generation stops on the stop ids
    (`stop_token_ids`); a grammar ends an answer with the chat template's end-of-turn token
    (the eos token when the template has none); prompts are left-padded with the pad id (the
    model's, or 0)."""
    eot = end_of_turn_id(tokenizer)
    pad = tokenizer.pad_token_id
    return (stop_token_ids(tokenizer, config),
            int(eot if eot is not None else tokenizer.eos_token_id),
            int(pad if pad is not None else config.pad_token_id or 0))
