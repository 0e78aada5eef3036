"""Bounds a Social-RL config's shapes must stay within, checked from the config alone.

`problems(config)` returns one line per problem, each naming its `--config.` key; it is part of
`train.checks.check`, so a config that breaks a bound is refused before a model is loaded,
anything is allocated or a workdir is written. Two kinds of bound:

- hard limits, the module constants below: `MAX_PERSONA_TOKENS` for a persona, `MAX_ID` for
  the society's int32 post slots.
- this machine's memory. From the config alone (no weights, no compile) this module bounds the
  prompt length (`prompt_len`: the longest persona, the instruction, feed_size posts of
  content_len tokens with their names, counts and shown comments, the chat template), reads the
  model's shapes (`model.preset`, or the checkpoint's config.json / GGUF header) and sizes the
  largest buffers of the run: the set-up's text-bank pass (`memory.encode_bytes`: the interest
  descriptions and personas padded to the longest, 64 texts at a time), the epoch's programs
  (`memory.estimate`, as `setup.memory_estimate` calls it after set-up: KV cache of the
  agents acting per tick, prompt + new tokens; the scoring pass and the update over ticks x
  agents trajectories; the society's per-user and per-post arrays; the per-tick records of
  every post slot) and the host's copies of the agents' tokenized personas. It compares the
  bytes the config's *shape keys* add (the estimate minus the same estimate at the smallest
  shapes: 1 agent, 1 tick, 1 new token, ...) with the memory of the backend the run will use:
  one device's (`memory.device_memory_bytes`, GPU/TPU), per device after the mesh's sharding
  (`mesh.shape` over this process's devices), or on the CPU the host's RAM
  (`memory.host_memory_bytes`): a per-device need above it cannot fit however many CPU devices
  share it. The weights, optimizer state and their copies are left to the set-up's own check
  (`setup.check_memory`, which compares the whole estimate once the model is known): a
  config for a bigger machine (configs/general.py, an 8B on a pod) still passes here, where
  tests build it abstractly. The refusal names the shape key whose smallest value would save
  the most. Multi-process runs (`distributed.enabled`, JAX_COORDINATOR_ADDRESS) skip the memory
  comparison: the backend must not start before `jax.distributed.initialize`; so do builds
  that allocate nothing (`problems(config, machine=False)`).

Token counts are exact with the run's tokenizer when its `tokenizer.json` is at hand (a preset's
tiny tokenizer, an HF checkpoint directory, `--config.tokenizer`), read with the `tokenizers`
library (~30 ms, no transformers import); otherwise (a GGUF checkpoint) an upper bound: one
token per UTF-8 byte plus one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable, Dict, List, Optional, Tuple

from jaxsocial.train import config as run_config
from jaxsocial.train import memory

GiB = memory.GiB

MAX_PERSONA_TOKENS = 2048
"""Longest persona, in tokens of the run's tokenizer (" " + persona, as the text bank tokenizes
it). A persona is the system message of every prompt the agent gets, and the set-up's text-bank
pass pads every interest description and persona to the longest one, so one long persona makes
every prompt and every text-bank row that long (attention memory grows with its square).
2048 tokens is about 8 KB of English text for Llama-3's tokenizer (about 3 KB for the tiny
byte-level one), a hundred times the shipped personas (about 20 tokens); longer personas are
refused. On a 23.5 GiB CPU host the demo reaches about 16 GiB for the text-bank pass at this
length (`memory.encode_bytes`), which the memory bound checks separately."""

MAX_ID = 2 ** 31 - 1
"""Largest society size an int32 id can address: post ids and slots (`society.post_capacity`)
and user ids are int32 (`social.state`); `SocialParams.validate` bounds num_users tighter
(num_users * 8 < 2**31)."""

CHAT_TEMPLATE_TOKENS = 64
"""Bound on what a chat template adds around the system and user messages and the assistant's
header (Llama-3's: 15 tokens, with its tokenizer or the tiny one; ChatML's, Qwen2 and SmolLM2:
about 13): the prompt-length bound counts this many."""

TEXT_BANK_CHUNK = 64
"""Rows per call of the set-up's text-bank pass (`social.text_bank.embed_rows`' default)."""

_PROMPT_BUCKET = 64  # PromptTemplate.build rounds max_len up to this


_get = run_config.config_get


# ---------------------------------------------------------------------------------------------
# tokens


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


# ---------------------------------------------------------------------------------------------
# shapes


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sizes of a run that set its buffers, from the config (`shapes`).

    Prompt pieces in tokens: persona (longest), interest (longest crowd interest description),
    fixed (chat template, instruction, footer), post_base / comment_base (one feed post's /
    shown comment's labels, names, separators and counts besides its content), shown (comments
    shown per post). Then the society's and rollout's sizes."""

    persona: int
    interest: int
    fixed: int
    post_base: int
    comment_base: int
    shown: int
    feed_size: int
    content_len: int
    max_new: int
    num_users: int
    num_agents: int
    active: int
    ticks: int
    post_capacity: int
    descriptions: int  # crowd interest descriptions (text-bank rows besides the personas)
    text_rows: int  # crowd post + comment bank rows

    @property
    def prompt_len(self) -> int:
        """Bound on `PromptTemplate.max_len` (its worst case, rounded up to 64)."""
        post = (self.post_base + self.content_len
                + self.shown * (self.comment_base + self.content_len))
        worst = self.fixed + self.persona + self.feed_size * post
        return -(-worst // _PROMPT_BUCKET) * _PROMPT_BUCKET


def _personas(config) -> List[str]:
    personas = list(_get(config, "agents.personas", ()) or ())
    return personas[:max(1, int(_get(config, "agents.num_agents", 1)))]


def shapes(config, count: Optional[Callable[[str], int]] = None) -> Shapes:
    """The config's `Shapes` (token counts with `count`, default `token_counter(config)`)."""
    from jaxsocial.agents import prompting, tool_calls
    from jaxsocial.social import text_bank

    count = count or token_counter(config)[0]
    s = config.society
    personas = _personas(config)
    persona = max((count(" " + p) for p in personas), default=0)
    corpus = text_bank.load_corpus(_get(config, "crowd_text.path", "") or None)
    interest = max((count(" " + t) for t in corpus.interests), default=0)
    feed = int(s.feed_size)
    instruction, footer = run_config.prompt_text(
        config, lambda: tool_calls.tool_instruction(config.agents.actions, feed))
    fixed = CHAT_TEMPLATE_TOKENS + count(instruction + "\n") + count(footer)
    # The longest displayed name: an agent's, or " user" + an id's 3-digit groups.
    names = list(_get(config, "agents.names", ()) or ())
    if not names:
        names = []
        for p in personas:
            try:
                names.append(prompting.persona_name(p))
            except ValueError:
                names.append(p)  # the set-up refuses it; bound by the whole persona
    users = int(s.get("num_users", 1))
    digits = len(str(max(users - 1, 0)))
    # A crowd id's digit group: 3 digits, at most 3 tokens (byte-level BPE, byte fallback).
    name = max([count(" " + n) for n in names]
               + [count(prompting.CROWD_PREFIX) + -(-digits // 3) * 3])
    num = max(count(" " + prompting.count_text(n)) for n in (0, 9, 99, 999, 1000))
    word = max(count(w) for w in prompting.LIKE_WORDS + prompting.COMMENT_WORDS)
    n_sep, c_sep = count(prompting.NAME_SEP), count(prompting.COUNT_SEP)
    label = count(prompting.LABEL.format(k=feed))
    post_base = label + name + n_sep + 2 * (c_sep + num + word) + count(prompting.POST_END)
    comment = name + n_sep + c_sep + num + word
    comments = int(s.get("feed_comments", 0) or 0)
    if comments:
        com_label = count(prompting.COMMENT_LABEL.format(n=feed + feed * comments))
        comment_base = (count(prompting.COMMENT_LINE) + com_label
                        + count(prompting.COMMENT_BY) + comment)
        shown = comments
    else:
        comment_base = count(prompting.COMMENT_HEAD) + comment
        shown = 1 if _get(config, "agents.newest_comment", True) else 0
    agents = int(config.agents.num_agents)
    code = bool(_get(config, "code.enabled", False))
    if code:
        from jaxsocial.train import code_problems
        text_rows = len(code_problems.TEXTS) + len(corpus.comments)
    else:
        text_rows = len(corpus.posts) + len(corpus.comments)
    return Shapes(
        persona=persona, interest=interest, fixed=fixed, post_base=post_base,
        comment_base=comment_base, shown=shown, feed_size=feed, content_len=int(s.content_len),
        max_new=int(config.rollout.max_new_tokens), num_users=users, num_agents=agents,
        active=int(_get(config, "agents.active_per_tick", 0) or 0) or agents,
        ticks=int(config.rollout.ticks_per_epoch), post_capacity=int(s.post_capacity),
        descriptions=len(corpus.interests), text_rows=text_rows)


# ---------------------------------------------------------------------------------------------
# the model


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


# ---------------------------------------------------------------------------------------------
# memory


def _micro(rl, rows: int) -> int:
    try:
        return rl.accumulation(rows)[1]
    except ValueError:  # the floor's rows need not divide; any split bounds it
        return max(1, int(rl.micro_batch or 0) or rows // max(1, int(rl.num_minibatches)))


@dataclasses.dataclass(frozen=True)
class Need:
    """Bytes of a run's largest buffers: `epoch`, per device (`memory.estimate`'s peak);
    `encode`, the set-up's text-bank pass on one device; `host`, the agents' tokenized personas
    and text-bank rows the host keeps."""

    epoch: int
    encode: int
    host: int


def need(config, sh: Shapes, cfg, mesh_shape, rl) -> Need:
    """`Need` of `config` with the sizes `sh`, the model `cfg` on `mesh_shape` and `rl` (the
    run's PPOConfig / GRPOConfig, `train.config.rl_config`)."""
    from jaxsocial.social import society

    c = config
    rows = sh.ticks * sh.active
    if int(rl.micro_batch or 0) == 0:  # automatic: as the set-up resolves it for these sizes
        rl = rl.replace(micro_batch=run_config.micro_batch(
            c, rows // max(1, int(rl.num_minibatches)), sh.prompt_len + sh.max_new,
            mesh_shape))
    sp = society.make_params(**run_config.society_fields(c), num_agents=sh.num_agents)
    sp = sp.replace(num_users=sh.num_users, post_capacity=sh.post_capacity,
                    content_len=sh.content_len, feed_size=sh.feed_size,
                    num_agents=sh.num_agents)
    fused = bool(_get(c, "train.fused_epoch", True)) and not _get(c, "code.enabled", False)
    est = memory.estimate(
        cfg, tuple(mesh_shape), batch=sh.active, prompt_len=sh.prompt_len,
        response_len=sh.max_new, train_micro_batch=_micro(rl, rows),
        lora_rank=int(_get(c, "rl.lora_rank", 0)), remat=cfg.remat, trajectories=rows,
        minibatch_rows=rows // max(1, int(rl.num_minibatches)),
        score_micro_batch=int(rl.micro_batch or 0), score_sharded=True,
        attention_chunk=int(cfg.attention_chunk), donate=fused, social_params=sp,
        text_rows=sh.text_rows, scan_layers=bool(cfg.scan_layers))
    long_rows = sh.descriptions + sh.num_agents
    length = max(sh.persona, sh.interest, 1)
    encode = memory.encode_bytes(cfg, min(TEXT_BANK_CHUNK, long_rows), length)
    # Host: the text-bank rows [Nd + A, longest] int32 and their pooled float32 states, the
    # prompt template's persona table [A, persona] int32.
    host = long_rows * (length * 4 + cfg.hidden_size * 4) + sh.num_agents * sh.persona * 4
    return Need(epoch=est.peak, encode=encode, host=host)


# The shape keys, the Shapes fields each one sets, and their smallest values (the floor).
_KNOBS = (
    ("agents.personas", dict(persona=1)),
    ("rollout.max_new_tokens", dict(max_new=1)),
    ("society.post_capacity", dict(post_capacity=1)),
    ("society.num_users", None),  # down to num_agents
    ("agents.num_agents", dict(num_agents=1, active=1)),
    ("agents.active_per_tick", dict(active=1)),
    ("rollout.ticks_per_epoch", dict(ticks=1)),
    ("society.content_len", dict(content_len=1)),
    ("society.feed_size", dict(feed_size=1)),
)


def _floor(sh: Shapes, key: str) -> Shapes:
    change = dict(_KNOBS)[key]
    if change is None:
        change = dict(num_users=sh.num_agents)
    return dataclasses.replace(sh, **change)


def _all_floors(sh: Shapes) -> Shapes:
    for key, _ in _KNOBS:
        sh = _floor(sh, key)
    return dataclasses.replace(sh, num_users=1)


def _describe(config, key: str, sh: Shapes, exact: bool) -> str:
    if key == "agents.personas":
        how = "" if exact else " (UTF-8 bytes + 1, a bound: no tokenizer.json at hand)"
        return f"agents.personas: the longest persona is {sh.persona} tokens{how}"
    if key == "agents.num_agents" and sh.active == sh.num_agents:
        return (f"agents.num_agents={sh.num_agents} (all of them act each tick: "
                f"agents.active_per_tick=0)")
    return f"{key}={_get(config, key)}"


def _blame(config, sh, cfg, mesh_shape, rl, part: str) -> str:
    """The shape key whose floor alone saves the most of `part` of the `Need`."""
    base = getattr(need(config, sh, cfg, mesh_shape, rl), part)
    keys = [k for k, _ in _KNOBS
            if not (k == "agents.active_per_tick" and sh.active == sh.num_agents)]
    saved = {k: base - getattr(need(config, _floor(sh, k), cfg, mesh_shape, rl), part)
             for k in keys}
    return max(saved, key=saved.get)


def _mesh_shape(config, devices: int) -> Tuple[int, ...]:
    """`mesh.shape` over this process's devices; a shape that does not use them all (a caller
    passing its own mesh, e.g. (1, 1, 1) on the tests' 8 devices) as written, -1 read as 1."""
    from jaxsocial.train import sharding
    shape = tuple(int(s) for s in _get(config, "mesh.shape", (-1, 1, 1)))
    try:
        return tuple(sharding.resolve_mesh_shape(shape, devices))
    except ValueError:  # build_setup(config) without a mesh says why
        return tuple(max(1, s) for s in shape) if len(shape) == 3 else (1, 1, 1)


def _multi_process(config) -> bool:
    return bool(_get(config, "distributed.enabled", False)) or bool(
        os.environ.get("JAX_COORDINATOR_ADDRESS"))


def _gib(n: float) -> str:
    return f"{n / GiB:,.0f}" if n >= 10 * GiB else f"{n / GiB:.1f}"


def problems(config, machine: bool = True) -> List[str]:
    """One-line problems of `config` against the hard limits and this machine's memory (see the
    module docstring); [] when it fits, or when the config is not a Social-RL one. machine=False:
    the hard limits only, for a build that allocates nothing and may target a bigger machine
    (`scale.aot.abstract_run`: abstract weights, programs compiled only to read their memory)."""
    if not all(k in config for k in ("agents", "society", "rollout", "model")):
        return []
    out = []
    count, exact = token_counter(config)
    sh = shapes(config, count)
    if sh.persona > MAX_PERSONA_TOKENS:
        how = "" if exact else " (UTF-8 bytes + 1, a bound: no tokenizer.json at hand)"
        out.append(f"agents.personas: the longest persona is {sh.persona} tokens{how}, more "
                   f"than bounds.MAX_PERSONA_TOKENS={MAX_PERSONA_TOKENS} (every prompt and "
                   f"text-bank row is padded to it); shorten it")
    if sh.post_capacity > MAX_ID:
        out.append(f"society.post_capacity={sh.post_capacity} exceeds the int32 post slots "
                   f"(at most {MAX_ID})")
    if out or _multi_process(config) or not machine:
        return out
    return memory_problems(config, sh, exact)


def memory_problems(config, sh: Shapes, exact: bool = True) -> List[str]:
    """The memory half of `problems`: what the config's shape keys add to the run's buffers,
    against this machine's memory (starts the JAX backend)."""
    import jax

    cfg = model_config(config)
    if cfg is None:
        return []
    total, kind, _ = memory.machine_memory()
    host = memory.host_memory_bytes()
    mesh_shape = _mesh_shape(config, jax.device_count())
    rl = run_config.rl_config(config, sh.active)
    full, floor = (need(config, sh, cfg, mesh_shape, rl),
                   need(config, _all_floors(sh), cfg, mesh_shape, rl))
    where = f"more than this machine's {total / GiB:.1f} GiB of {kind}"
    # The set-up's text-bank pass (one device).
    if full.encode - floor.encode > total:
        if sh.persona >= sh.interest:
            what = _describe(config, "agents.personas", sh, exact)
        else:
            what = (f"crowd_text.path: the longest interest description is {sh.interest} "
                    f"tokens")
        return [f"{what}; the set-up's text-bank pass over texts padded to it needs "
                f"~{_gib(full.encode)} GiB, {where}"]
    # The epoch's programs, per device (on the CPU: one device's share of the RAM at least).
    if full.epoch - floor.epoch > total:
        key = _blame(config, sh, cfg, mesh_shape, rl, "epoch")
        per = " per device" if math.prod(mesh_shape) > 1 else ""
        return [f"{_describe(config, key, sh, exact)}: the epoch needs ~{_gib(full.epoch)} "
                f"GiB{per} (prompts of up to {sh.prompt_len} + {sh.max_new} tokens, "
                f"{sh.active} per tick, {sh.ticks} ticks; memory.estimate), {where}"]
    # What the host keeps of the agents' texts.
    if full.host - floor.host > host:
        return [f"{_describe(config, 'agents.num_agents', sh, exact)}: the agents' tokenized "
                f"personas and text-bank rows need ~{_gib(full.host)} GiB of host RAM, more "
                f"than this machine's {host / GiB:.1f} GiB"]
    return []


def describe(config) -> Dict[str, object]:
    """What `problems` compares, for a person reading it: the shapes, the model, the need and
    the memory (starts the JAX backend)."""
    import jax

    count, exact = token_counter(config)
    sh = shapes(config, count)
    cfg = model_config(config)
    total, what, per_device = memory.machine_memory()
    mesh_shape = _mesh_shape(config, jax.device_count())
    out = dict(shapes=sh, exact_tokens=exact, prompt_len=sh.prompt_len, memory=total,
               memory_kind=what, per_device=per_device, mesh_shape=mesh_shape)
    if cfg is not None:
        rl = run_config.rl_config(config, sh.active)
        out.update(need=need(config, sh, cfg, mesh_shape, rl),
                   floor=need(config, _all_floors(sh), cfg, mesh_shape, rl))
    return out
