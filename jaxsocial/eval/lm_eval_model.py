"""jaxsocial's Llama and generation engine as an lm-evaluation-harness model.

    lm_eval --model jaxsocial --model_args checkpoint=DIR --tasks ...        (see docs/eval.md)
    lm_eval.simple_evaluate(model=JaxSocialLM(checkpoint=DIR), tasks=[...])

- `loglikelihood` / `loglikelihood_rolling`: teacher-forced log-probs of our Llama,
  log p(cont | ctx) = sum_t log_softmax(logits[t-1])[tok_t] over the continuation tokens,
  batched by length (longest first) and left-padded to power-of-two lengths so few shapes compile.
- `generate_until`: our batched `jaxsocial.generation.generate` (greedy unless the task asks for
  sampling); the stop strings (`until`) are applied here, since the harness does not truncate.

Loading, stop ids, the engine call and decoding are the shared chat engine's
(`jaxsocial.agents.chat.ChatModel`, `self.chat`); what is lm-eval's own stays here: raw-string
requests encoded as lm-eval's HF backend does, static batches of `batch_size` rows at power-of-two
lengths, teacher-forced scoring, stop strings.
- `apply_chat_template` / `tokenizer_name`: the checkpoint tokenizer's chat template, so
  `--apply_chat_template` works.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from jaxsocial.agents.chat import ChatModel
from jaxsocial.models import checkpoint_hf, llama


def _bucket(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= max(n, minimum)."""
    b = minimum
    while b < n:
        b *= 2
    return b


@functools.partial(jax.jit, static_argnums=0)
def _score_tokens(graphdef, state, ids, mask, targets):
    """Teacher-forced log p(targets) [B, T] float32 and greedy-match [B, T] bool. Module-level
    so checkpoints of one architecture (base, trained, judge) share the compiled program."""
    logits = nnx.merge(graphdef, state).forward(ids, mask).logits
    logp = jax.nn.log_softmax(logits, axis=-1)
    tok = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return tok, jnp.argmax(logits, axis=-1) == targets


def truncate_at_stops(text: str, stops: Sequence[str]) -> str:
    """`text` up to (excluding) the earliest occurrence of any non-empty stop string."""
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


def _as_bool(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "y")
    return bool(v)


@register_model("jaxsocial")
class JaxSocialLM(TemplateLM):
    """lm-eval model backed by `jaxsocial.models.llama` and `jaxsocial.generation.generate`.

    Args (all also accepted as `--model_args key=value`):
      checkpoint: Hugging Face-format directory (config.json, *.safetensors, tokenizer files).
      model / tokenizer: an already-built `llama.Llama` and HF tokenizer (instead of checkpoint).
      tokenizer_path: tokenizer directory when it differs from `checkpoint`.
      batch_size: rows per compiled call (the batch is padded up to it; static shapes).
      max_length: context window (default: the model's max_position_embeddings).
      max_gen_toks: default generation length when a task does not set one.
      dtype: compute dtype for a checkpoint ("float32", "bfloat16").
      seed: base of the `jax.random` keys for sampled generation (batch i uses fold_in(key, i)).
      add_bos_token: None (default): special tokens as the tokenizer's own default adds them,
        as lm-eval's HF backend does (SmolLM2's tokenizer adds none; Llama-3's adds its BOS);
        True / False: force them on or off.
      generate_fn: override of `jaxsocial.generation.generate` (same signature).
    """

    def __init__(self, checkpoint: Optional[str] = None, *, model: Optional[llama.Llama] = None,
                 tokenizer: Any = None, tokenizer_path: Optional[str] = None,
                 batch_size: Any = 8, max_length: Optional[int] = None, max_gen_toks: int = 256,
                 dtype: str = "float32", seed: int = 0, add_bos_token: Any = None,
                 generate_fn: Optional[Callable] = None, **kwargs):
        super().__init__()
        kwargs.pop("device", None)  # lm-eval passes these; one JAX process uses its devices
        kwargs.pop("max_batch_size", None)
        if kwargs:
            raise ValueError(f"unknown jaxsocial model_args: {sorted(kwargs)}")
        if model is None:
            if not checkpoint:
                raise ValueError("jaxsocial model needs checkpoint=DIR (or model= and tokenizer=)")
            if not os.path.isdir(checkpoint):
                raise ValueError(f"checkpoint directory not found: {checkpoint!r}")
            chat = ChatModel.load(checkpoint, dtype, tokenizer=tokenizer or tokenizer_path)
        else:
            if tokenizer is None:
                if not (tokenizer_path or checkpoint):
                    raise ValueError("jaxsocial model needs a tokenizer "
                                     "(tokenizer= or tokenizer_path=)")
                tokenizer = checkpoint_hf.load_tokenizer(tokenizer_path or checkpoint,
                                                         model=model)
            chat = ChatModel(model, tokenizer)
        self.chat = chat
        model, tokenizer = chat.model, chat.tokenizer
        self.model, self.tokenizer = model, tokenizer
        self.checkpoint = checkpoint
        self.batch_size = 8 if str(batch_size).startswith("auto") else int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        cfg = model.config
        self.max_length = int(max_length or cfg.max_position_embeddings)
        self.max_gen_toks = int(max_gen_toks)
        self.add_bos_token = None if add_bos_token is None else _as_bool(add_bos_token)
        self.key = jax.random.key(int(seed))
        self._generate_fn = generate_fn
        # lm-eval's own padding rule (the model config's pad id first), not the chat engine's
        self.pad_id = self._first_id(cfg.pad_token_id, tokenizer.pad_token_id, 0)
        self._score = functools.partial(_score_tokens, chat.graphdef)

    @staticmethod
    def _first_id(*ids) -> int:
        return next(int(i) for i in ids if i is not None)

    # -- tokenizer ---------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.model.config.eos_token_ids
        return self._first_id(self.tokenizer.eos_token_id, eos[0] if eos else None)

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return self.eot_token_id if bos is None else int(bos)

    @property
    def stop_token_ids(self) -> tuple:
        """The one loader's rule (`loading.stop_token_ids`): tokenizer eos + the chat
        template's end-of-turn + the model config's eos ids."""
        return self.chat.stop_ids

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None,
                   left_truncate_len: Optional[int] = None, **kwargs) -> list:
        """Token ids exactly as lm-eval's HF backend encodes them: special tokens as the
        tokenizer's own default adds them unless `add_special_tokens` / `add_bos_token` say
        otherwise, and none when the text already starts with the prefix token's text."""
        kw = {}
        if add_special_tokens is not None:
            kw["add_special_tokens"] = bool(add_special_tokens)
        elif self.add_bos_token is not None:
            kw["add_special_tokens"] = self.add_bos_token
        if add_special_tokens is None and string.startswith(
                self.tokenizer.decode([self.prefix_token_id])):
            kw["add_special_tokens"] = False
        ids = [int(i) for i in self.tokenizer.encode(string, **kw)]
        if left_truncate_len:
            ids = ids[-left_truncate_len:]
        return ids

    def tok_decode(self, tokens) -> str:
        return self.chat.decode(tokens)

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "jaxsocial").replace("/", "__")

    def chat_template(self, chat_template=False) -> Optional[str]:
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, chat_history: list, add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt)

    # -- log-likelihoods ---------------------------------------------------------------------
    def score_token_pairs(self, pairs: Sequence[tuple]) -> list:
        """[(context_ids, continuation_ids)] -> [(sum log p(continuation), is_greedy)].

        Sequences longer than max_length + 1 keep their last max_length + 1 tokens (the
        continuation is never cut unless it alone is longer).
        """
        out = [None] * len(pairs)
        rows = []
        for i, (ctx, cont) in enumerate(pairs):
            if not cont:
                out[i] = (0.0, True)
                continue
            if not ctx:
                raise ValueError(f"request {i} has an empty context; give a prefix token")
            whole = (list(ctx) + list(cont))[-(self.max_length + 1):]
            rows.append((i, whole[:-1], whole[1:], min(len(cont), len(whole) - 1)))
        rows.sort(key=lambda r: -len(r[1]))  # similar lengths share a padded shape
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start:start + self.batch_size]
            t = min(_bucket(len(chunk[0][1])), max(self.max_length, len(chunk[0][1])))
            ids = np.full((self.batch_size, t), self.pad_id, np.int32)
            tgt = np.zeros((self.batch_size, t), np.int32)
            mask = np.zeros((self.batch_size, t), bool)
            for r, (_, inp, targets, _) in enumerate(chunk):
                ids[r, t - len(inp):] = inp
                tgt[r, t - len(inp):] = targets
                mask[r, t - len(inp):] = True
            mask[len(chunk):, -1] = True  # filler rows: one real token keeps softmax finite
            tok, greedy = self._score(self.chat.state, jnp.asarray(ids), jnp.asarray(mask),
                                      jnp.asarray(tgt))
            tok, greedy = np.asarray(tok), np.asarray(greedy)
            for r, (i, _, _, n) in enumerate(chunk):
                out[i] = (float(tok[r, t - n:].sum(dtype=np.float64)),
                          bool(greedy[r, t - n:].all()))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list:
        res = self.score_token_pairs([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), r in zip(requests, res):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, r)
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list:
        """Sum of log p(token) over a whole string, in disjoint windows of max_length tokens,
        the first conditioned on the prefix token (BOS)."""
        windows, owner = [], []
        for j, req in enumerate(tqdm(requests, disable=disable_tqdm, desc="rolling windows")):
            (string,) = req.args
            toks = self.tok_encode(string, add_special_tokens=False)
            for w in get_rolling_token_windows(token_list=toks, prefix_token=self.prefix_token_id,
                                               max_seq_len=self.max_length, context_len=1):
                windows.append(make_disjoint_window(w))
                owner.append(j)
        scores = self.score_token_pairs(windows)
        totals = [0.0] * len(requests)
        for j, (lp, _) in zip(owner, scores):
            totals[j] += lp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation --------------------------------------------------------------------------
    def _sampling(self, gen_kwargs: dict):
        kw = dict(gen_kwargs)
        until = kw.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(kw.pop("max_gen_toks", kw.pop("max_new_tokens", self.max_gen_toks)))
        do_sample = _as_bool(kw.pop("do_sample", False))
        temperature = float(kw.pop("temperature", 1.0 if do_sample else 0.0))
        if not do_sample:
            temperature = 0.0
        stops = []
        for s in until:  # a stop string that is exactly one token can end decoding early
            ids = self.tokenizer(s, add_special_tokens=False)["input_ids"]
            if len(ids) == 1 and self.tokenizer.decode(ids) == s:
                stops.append(int(ids[0]))
        config = self.chat.sampling(max_new, stops, temperature=temperature,
                                    top_k=int(kw.pop("top_k", 0) or 0),
                                    top_p=float(kw.pop("top_p", 1.0) or 1.0))
        return config, until

    def _generate(self):
        if self._generate_fn is None:

            def engine(model, ids, mask, key, config):  # the chat engine's split, made once
                return self.chat.generate(ids, mask, key, config)

            self._generate_fn = engine
        return self._generate_fn

    def generate_until(self, requests, disable_tqdm: bool = False) -> list:
        results = [None] * len(requests)
        groups: dict = {}
        for i, req in enumerate(requests):
            ctx, gen_kwargs = req.args
            groups.setdefault(json.dumps(gen_kwargs, sort_keys=True, default=str), []).append(i)
        batch_no = 0
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until")
        for idxs in groups.values():
            config, until = self._sampling(requests[idxs[0]].args[1])
            budget = max(1, self.max_length - config.max_new_tokens)
            encoded = {i: self.tok_encode(requests[i].args[0], left_truncate_len=budget)
                       for i in idxs}
            idxs = sorted(idxs, key=lambda i: -len(encoded[i]))
            for start in range(0, len(idxs), self.batch_size):
                chunk = idxs[start:start + self.batch_size]
                t = _bucket(len(encoded[chunk[0]]))
                ids = np.full((self.batch_size, t), self.pad_id, np.int32)
                mask = np.zeros((self.batch_size, t), bool)
                for r in range(self.batch_size):  # filler rows repeat the last prompt
                    toks = encoded[chunk[min(r, len(chunk) - 1)]]
                    ids[r, t - len(toks):] = toks
                    mask[r, t - len(toks):] = True
                key = jax.random.fold_in(self.key, batch_no)
                batch_no += 1
                out = self._generate()(self.model, jnp.asarray(ids), jnp.asarray(mask), key,
                                       config)
                tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
                for r, i in enumerate(chunk):
                    row = [int(x) for x in tokens[r, :lengths[r]]]
                    while row and row[-1] in config.stop_token_ids:
                        row.pop()
                    text = truncate_at_stops(self.tok_decode(row), until)
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        return results
