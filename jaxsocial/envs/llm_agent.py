"""LLM agents in the social-learning tournament: prompt renderer, completion parser, rollout.

Each round an LLM agent answers twice, both through the chat engine
(`jaxsocial.agents.chat.ChatModel`, batched `jaxsocial.generation` underneath):

1. the learning decision: its prompt shows the round, the tokens left, its repertoire with
   estimates, and (social populations) the peers' last pulls; the completion is parsed into
   `LEARN: skip | innovate | revise | observe <agent>`;
2. the pull: the prompt adds what learning brought; the completion is parsed into `PULL: <arm>`.

The agent pays its real generated token counts (`GenerationOutput.lengths`, stop token
included) out of the round's budget; the env decides whether the learning action was affordable
and whether tokens remained for the pull. A completion that does not parse is counted as
malformed and played as SKIP / no pull (a missed pull earns 0), never fatal. With
`grammar=True` the completions are constrained to the action grammar
(`jaxsocial.generation.grammar`), so they always parse.

Forced-search rounds skip the learning generation (the env imposes INNOVATE, 0 tokens).
"""
from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsocial.agents.chat import ChatModel, messages
from jaxsocial.envs import social_learning as sl
from jaxsocial.generation import grammar as g

SYSTEM_PROMPT = (
    "You are an agent in a multi-armed bandit game played by a population of agents. "
    "Each round you first take one learning action, then pull one arm and earn its noisy "
    "reward. Learning and pulling share one token budget per round: if you run out of tokens "
    "before pulling, you earn nothing that round. Answer with exactly one line in the "
    "requested format.")

_LEARN_RE = re.compile(r"learn\s*:\s*(skip|innovate|revise|observe)(?:\s+(?:agent\s*)?(\d+))?",
                       re.IGNORECASE)
_PULL_RE = re.compile(r"pull\s*:\s*(?:arm\s*)?(\d+)", re.IGNORECASE)
_KINDS = {"skip": sl.SKIP, "innovate": sl.INNOVATE, "revise": sl.REVISE, "observe": sl.OBSERVE}
_ORIGIN_WORDS = {sl.ORIGIN_INNOVATED: "found yourself", sl.ORIGIN_COPIED: "copied",
                 sl.ORIGIN_REVISED: "revised", sl.ORIGIN_MISCOPIED: "copied (garbled)"}


@dataclasses.dataclass(frozen=True)
class AgentView:
    """What agent `agent` sees this round (plain Python, for the renderer)."""

    agent: int
    num_agents: int
    num_arms: int
    round: int  # 0-based
    num_rounds: int
    remaining: int  # tokens left this round
    repertoire: tuple  # ((arm, mean or None, n, origin code), ...)
    peers: tuple  # ((agent, arm or None, reward or None), ...) other agents' last pulls
    social: bool
    open_arms: bool
    forced: bool = False
    learned: str = ""  # outcome of this round's learning action (pull prompt only)


def agent_view(obs: sl.Observation, state: sl.EnvState, i: int, params: sl.EnvParams,
               social: bool, learned: str = "") -> AgentView:
    """Agent i's view from ONE population's observation/state (numpy-convertible arrays)."""
    known = np.asarray(obs.known[i])
    cnt = np.asarray(obs.est_count[i])
    ssum = np.asarray(obs.est_sum[i])
    origin = np.asarray(state.origin[i])
    rep = tuple((int(k), float(ssum[k] / cnt[k]) if cnt[k] else None, int(cnt[k]), int(origin[k]))
                for k in np.flatnonzero(known))
    last_arm, last_r = np.asarray(obs.last_arm), np.asarray(obs.last_reward)
    peers = tuple((j, int(last_arm[j]) if last_arm[j] >= 0 else None,
                   float(last_r[j]) if last_arm[j] >= 0 else None)
                  for j in range(params.num_agents) if j != i)
    return AgentView(agent=i, num_agents=params.num_agents, num_arms=params.num_arms,
                     round=int(obs.t), num_rounds=params.num_rounds,
                     remaining=int(np.asarray(obs.remaining)[i]), repertoire=rep, peers=peers,
                     social=bool(social), open_arms=bool(params.open_arms),
                     forced=bool(np.asarray(obs.forced)[i]), learned=learned)


def _state_lines(v: AgentView) -> list:
    lines = [f"You are agent {v.agent} of {v.num_agents}. There are {v.num_arms} arms, "
             f"numbered 0 to {v.num_arms - 1}.",
             f"Round {v.round + 1} of {v.num_rounds}. Tokens left this round: {v.remaining}."]
    if v.repertoire:
        lines.append("Your arms (mean reward over your samples):")
        for arm, mean, n, origin in v.repertoire:
            est = f"{mean:.2f} over {n} sample{'s' if n != 1 else ''}" if n else "not tried yet"
            how = _ORIGIN_WORDS.get(origin, "")
            lines.append(f"  arm {arm}: {est}" + (f" ({how})" if how else ""))
    else:
        lines.append("You do not know any arm yet.")
    if v.social:
        lines.append("Other agents' last pulls:")
        for j, arm, r in v.peers:
            lines.append(f"  agent {j}: " + (f"arm {arm}, reward {r:.2f}" if arm is not None
                                             else "has not pulled yet"))
    return lines


def render_learn_prompt(v: AgentView) -> str:
    """User message of the learning decision (repertoire, estimates, peers, budget)."""
    lines = _state_lines(v)
    opts = ["skip", "innovate (learn a random arm you have never known)",
            "revise (learn an arm next to your best one)"]
    if v.social:
        opts.append("observe <agent> (learn that agent's last arm and its reward)")
    lines.append("Choose one learning action: " + "; ".join(opts) + ".")
    fmt = "LEARN: skip | LEARN: innovate | LEARN: revise" + (
        " | LEARN: observe <agent>" if v.social else "")
    lines.append(f"Answer with one line: {fmt}")
    return "\n".join(lines)


def render_pull_prompt(v: AgentView) -> str:
    """User message of the pull decision (state after learning plus its outcome)."""
    lines = _state_lines(v)
    if v.learned:
        lines.append(v.learned)
    which = ("any arm" if v.open_arms else "one of your arms")
    lines.append(f"Now pull {which}. Answer with one line: PULL: <arm>")
    return "\n".join(lines)


def describe_learning(kind: int, acquired: int, reward: float, target: int, forced: bool) -> str:
    """One line telling the agent what its learning action brought."""
    if forced:
        return (f"This round you had to search on your own: you found arm {acquired}; "
                "you must pull it.")
    if kind == sl.OBSERVE:
        return f"You observed agent {target}: arm {acquired} gave reward {reward:.2f}."
    if kind == sl.INNOVATE:
        return f"You found a new arm: arm {acquired}."
    if kind == sl.REVISE:
        return f"You revised your best arm into arm {acquired}."
    return "You did not learn anything new this round."


def parse_learn(text: str, num_agents: int) -> tuple[int, int, bool]:
    """Completion -> (kind, target, ok). The LAST `LEARN: ...` in the text counts (models may
    reason first). observe needs an agent id in [0, N); anything else is malformed -> SKIP."""
    matches = list(_LEARN_RE.finditer(text))
    if not matches:
        return sl.SKIP, 0, False
    m = matches[-1]
    kind = _KINDS[m.group(1).lower()]
    if kind == sl.OBSERVE:
        if m.group(2) is None or not 0 <= int(m.group(2)) < num_agents:
            return sl.SKIP, 0, False
        return kind, int(m.group(2)), True
    return kind, 0, True


def parse_pull(text: str, num_arms: int) -> tuple[int, bool]:
    """Completion -> (arm, ok); the LAST `PULL: <arm>` counts; malformed -> (PULL_NONE, False)."""
    matches = list(_PULL_RE.finditer(text))
    if not matches:
        return sl.PULL_NONE, False
    arm = int(matches[-1].group(1))
    if not 0 <= arm < num_arms:
        return sl.PULL_NONE, False
    return arm, True


def action_grammars(tokenizer, num_agents: int, num_arms: int, social: bool, vocab_size: int,
                    end_token_id: int):
    """(learn grammar, pull grammar) over the tokenizer's canonical encodings of the formats."""

    def enc(s):
        return tokenizer.encode(s, add_special_tokens=False)
    learn = [[g.Tokens(enc("LEARN: skip"))], [g.Tokens(enc("LEARN: innovate"))],
             [g.Tokens(enc("LEARN: revise"))]]
    if social:
        learn.append([g.Tokens(enc("LEARN: observe ")),
                      g.OneOf(tuple(tuple(enc(str(j))) for j in range(num_agents)))])
    pull = [[g.Tokens(enc("PULL: ")), g.OneOf(tuple(tuple(enc(str(k))) for k in range(num_arms)))]]
    return (g.compile_grammar(learn, vocab_size, end_token_ids=[end_token_id]),
            g.compile_grammar(pull, vocab_size, end_token_ids=[end_token_id]))


@dataclasses.dataclass(frozen=True)
class LLMAgentConfig:
    max_learn_tokens: int = 256
    max_pull_tokens: int = 64
    temperature: float = 0.7
    top_p: float = 1.0
    grammar: bool = True
    prompt_bucket: int = 256  # few prompt buckets -> few compiled programs as prompts grow
    dtype: str = "float32"

    @classmethod
    def from_config(cls, c) -> "LLMAgentConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(c).items() if k in fields})


class LLMRun(NamedTuple):
    states: sl.EnvState  # final, leading seed axis S
    traj: sl.RoundRecord  # [S, T, ...]
    malformed_learn: int
    malformed_pull: int
    truncated: int
    completions: list  # a few (prompt, completion) samples for inspection
    texts: list  # per round: (learn completions [S][N], pull completions [S][N]); "" if not asked
    asked_learn: int = 0  # learning completions generated (forced-search rounds ask none)


def _batched(fn):
    return jax.jit(jax.vmap(fn, in_axes=(0, 0, 0, None)), compiler_options=sl.FAST_COMPILE)


_LEARN_B = _batched(sl.learn)
_EXPLOIT_B = _batched(sl.exploit)
_RESET_B = jax.jit(jax.vmap(sl.reset, in_axes=(0, None)), compiler_options=sl.FAST_COMPILE)


class LLMAgent:
    """Plays populations of LLM agents; one model for every agent of a population.

    The chat engine (loading, chat-template encoding, batched generation, decoding, stop ids)
    is `self.chat`, a `jaxsocial.agents.chat.ChatModel`; what is the tournament's own is here:
    the system prompt, the action grammars and the rollout."""

    def __init__(self, model, tokenizer, config: LLMAgentConfig = LLMAgentConfig()):
        self._attach(ChatModel(model, tokenizer), config)

    def _attach(self, chat: ChatModel, config: LLMAgentConfig) -> None:
        self.chat, self.config = chat, config
        self.model, self.tokenizer = chat.model, chat.tokenizer
        # The grammar ends an answer with the chat template's end-of-turn token; generation
        # stops on any stop id of the one loader's rule.
        self.stop_ids, self.eot, self.pad = chat.stop_ids, chat.eot, chat.pad
        self._grammars = {}

    @classmethod
    def from_chat(cls, chat: ChatModel, config: LLMAgentConfig = LLMAgentConfig()) -> "LLMAgent":
        """An agent over an already loaded `ChatModel`."""
        agent = cls.__new__(cls)
        agent._attach(chat, config)
        return agent

    @classmethod
    def load(cls, checkpoint: str, config: LLMAgentConfig = LLMAgentConfig()) -> "LLMAgent":
        """checkpoint: a checkpoint path (HF directory or GGUF) or a preset name ("tiny": the
        random tiny demo model), read by the one loader (`ChatModel.load`)."""
        if not checkpoint:
            raise ValueError("llm.checkpoint is empty: give a Llama checkpoint directory or 'tiny'")
        return cls.from_chat(ChatModel.load(checkpoint, dtype=config.dtype), config)

    # ------------------------------------------------------------------ generation
    def encode(self, user_messages: Sequence[str]):
        """Chat-templated, left-padded prompts -> (ids [B, L] int32, mask [B, L] int32)."""
        return self.chat.encode([messages(msg, SYSTEM_PROMPT) for msg in user_messages])

    def complete(self, user_messages: Sequence[str], key, max_new_tokens: int, grammar=None):
        """-> (texts [B], lengths [B] int (tokens generated, stop included), truncated [B] bool)."""
        c = self.config
        out = self.chat.complete([messages(msg, SYSTEM_PROMPT) for msg in user_messages], key,
                                 max_new_tokens, grammar=grammar, temperature=c.temperature,
                                 top_p=c.top_p, prompt_bucket=c.prompt_bucket)
        return out.texts, out.lengths, ~out.stopped & (out.lengths >= max_new_tokens)

    def grammars(self, params: sl.EnvParams, social: bool):
        if not self.config.grammar:
            return None, None
        key = (params.num_agents, params.num_arms, social)
        if key not in self._grammars:
            self._grammars[key] = action_grammars(
                self.tokenizer, params.num_agents, params.num_arms, social,
                self.model.config.vocab_size, self.eot)
        return self._grammars[key]

    # ------------------------------------------------------------------ rollout
    def run(self, keys, params: sl.EnvParams, record: int = 4) -> LLMRun:
        """Play S populations (one per key, matched to `rollout_batch`'s resets) for T rounds."""
        params.validate()
        social = bool(params.social)
        s_, n, c = keys.shape[0], params.num_agents, self.config
        g_learn, g_pull = self.grammars(params, social)
        _, states = _RESET_B(keys, params)
        step_keys = jax.vmap(
            lambda k: jax.random.split(jax.random.fold_in(k, 7), params.num_rounds * 3))(keys)
        recs, samples, logs = [], [], []
        bad_learn = bad_pull = trunc = asked = 0
        def host(tree):
            return jax.tree.map(np.asarray, tree)
        def pop(tree, b):
            return jax.tree.map(lambda x: x[b], tree)
        for t in range(params.num_rounds):
            obs = host(sl._obs(states))
            hstates = host(states)
            views = [[agent_view(pop(obs, b), pop(hstates, b), i, params, social) for i in range(n)]
                     for b in range(s_)]
            prompts = [render_learn_prompt(v) for row in views for v in row]
            texts, lens, tr = self.complete(prompts, jax.random.fold_in(step_keys[0, 3 * t], 1),
                                            c.max_learn_tokens, g_learn)
            kind = np.zeros((s_, n), np.int32)
            target = np.zeros((s_, n), np.int32)
            tokens = np.zeros((s_, n), np.int32)
            # forced search is imposed while the agent still has never-known arms
            forced = np.asarray(obs.forced) & (~np.asarray(obs.known)).any(-1)
            learn_texts = [["" if forced[b, i] else texts[b * n + i] for i in range(n)]
                           for b in range(s_)]
            for idx, text in enumerate(texts):
                b, i = divmod(idx, n)
                if forced[b, i]:  # the env imposes the search; the model is not asked
                    continue
                k, j, ok = parse_learn(text, n)
                asked += 1
                bad_learn += not ok
                trunc += bool(tr[idx])
                kind[b, i], target[b, i], tokens[b, i] = k, j, lens[idx]
            if len(samples) < record:
                samples.append((prompts[0], texts[0]))
            la = sl.LearnAction(jnp.asarray(kind), jnp.asarray(target), jnp.asarray(tokens))
            obs2, states, info_l = _LEARN_B(step_keys[:, 3 * t + 1], states, la, params)
            obs2, hstates = host(obs2), host(states)
            acq, acq_r, done_kind = obs2.acquired, obs2.acquired_reward, obs2.learn_kind
            views = [[agent_view(pop(obs2, b), pop(hstates, b), i, params, social,
                                 describe_learning(int(done_kind[b, i]), int(acq[b, i]),
                                                   float(acq_r[b, i]), int(target[b, i]),
                                                   bool(forced[b, i])))
                      for i in range(n)] for b in range(s_)]
            prompts = [render_pull_prompt(v) for row in views for v in row]
            # generation keys come from their own stream (fold_in), never reused by the env
            texts, lens, tr = self.complete(prompts, jax.random.fold_in(step_keys[0, 3 * t], 2),
                                            c.max_pull_tokens, g_pull)
            logs.append((learn_texts, [texts[b * n:(b + 1) * n] for b in range(s_)]))
            arm = np.full((s_, n), sl.PULL_NONE, np.int32)
            for idx, text in enumerate(texts):
                b, i = divmod(idx, n)
                a, ok = parse_pull(text, params.num_arms)
                bad_pull += not ok
                trunc += bool(tr[idx])
                arm[b, i] = a
            ea = sl.ExploitAction(jnp.asarray(arm), jnp.asarray(lens.reshape(s_, n)))
            _, states, _, _, info_e = _EXPLOIT_B(step_keys[:, 3 * t + 2], states, ea, params)
            info = {**info_l, **info_e}
            recs.append(sl.RoundRecord(**{f: np.asarray(info[f]) for f in sl.RoundRecord._fields}))
        traj = jax.tree.map(lambda *xs: np.stack(xs, axis=1), *recs)
        return LLMRun(states, traj, int(bad_learn), int(bad_pull), int(trunc), samples, logs,
                      asked)
