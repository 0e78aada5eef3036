"""Skill evolution with a real LLM: prompts, the revise step, the LLM decider and the run loop.

One `SkillLLM` (the chat engine `jaxsocial.agents.chat.ChatModel` over our batched
`jaxsocial.generation`) plays every agent of a population. Per round (host loop over rounds;
every generation is one batched call over the agents):

1. decide: rule deciders (`skill_evolution.Policy`) cost 0 tokens; the LLM decider is prompted
   with its own and its peers' recent scores and answers `LEARN: revise | LEARN: observe <j> |
   LEARN: skip` (grammar-constrained by default); its real tokens are the decision's cost;
2. revise (in OpenEvolve's spirit, written around our engine): the agent's LLM sees its deployed
   skill, that skill's training score and up to `max_failures` failed training prompts with the
   instructions they broke, and writes a new skill; the child answers `eval_batch` training
   prompts (per agent per round, drawn from the seed) and IFBench's checkers score it. Rewrite
   and evaluation tokens are learning tokens; both are capped by what learning may still spend;
3. act: each agent's deployed skill answers the round's `act_batch` training prompts (the same
   prompts for every agent and every decider with the same seed); each answer is capped at
   min(max_answer_tokens, remaining // act_batch);
4. held-out: every agent's deployed skill is scored on the held-out prompts (not charged to any
   budget: a measurement), decoded greedily, so a skill's held-out score depends only on its
   text: a copy scores as its original and the cache is shared across deciders and seeds.

Per-row caps in one batched call: the batch generates up to the largest cap and each row is cut
at its own cap (tokens beyond it are neither counted nor shown), the same text a call with that
cap would give since decoding is causal.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsocial.agents.chat import ChatModel, messages
from jaxsocial.envs import ifbench
from jaxsocial.envs import metrics as slm
from jaxsocial.envs import skill_evolution as se
from jaxsocial.generation import grammar as g

DECIDE_SYSTEM = (
    "You are one agent in a population of agents that each improve a skill: a system prompt "
    "that makes an assistant follow formatting instructions exactly. Each round you either "
    "revise your own skill (costly: it is rewritten and re-tested), observe another agent "
    "(cheap: you copy its latest skill and score) or skip. Answer with exactly one line.")

REVISE_SYSTEM = (
    "You improve system prompts. A system prompt (the skill) is given to an assistant that must "
    "follow every formatting and content instruction of a user's request exactly. Write an "
    "improved skill: short, general rules that fix the failures shown. Answer with the new "
    "skill text only.")

SEED_SKILLS = (
    "You are a helpful assistant.",
    "Follow every instruction in the request exactly, including length, format and wording "
    "constraints.",
    "Read the request carefully. Before answering, list its constraints to yourself, then "
    "write an answer that satisfies all of them.",
    "Answer concisely and obey all formatting rules the user gives.",
    "You are a precise assistant: constraints on words, sentences, paragraphs and symbols are "
    "strict requirements.",
)

_LEARN_RE = re.compile(r"learn\s*:\s*(skip|revise|observe)(?:\s+(?:agent\s*)?(\d+))?",
                       re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Generation and task sizes of a run (config block `run`)."""

    eval_batch: int = 8  # training prompts that score a revised skill
    act_batch: int = 4  # training prompts answered when acting, per round
    max_answer_tokens: int = 256
    max_revise_tokens: int = 256
    max_decide_tokens: int = 16
    max_failures: int = 2  # failed prompts shown to the reviser
    failure_chars: int = 300  # each shown prompt is cut to this many characters
    max_skill_chars: int = 2000
    recent: int = 3  # recent acting scores shown to the LLM decider
    heldout_seed: int = 1234
    heldout_every: int = 1  # held-out evaluation every k rounds (and always after the last)
    heldout_temperature: float = 0.0  # greedy: a skill's held-out score depends on its text
    heldout_batch: int = 32  # rows per held-out generation call
    temperature: float = 0.7
    top_p: float = 1.0
    grammar: bool = True  # constrain the LLM decision to the action grammar
    prompt_bucket: int = 128
    dtype: str = "float32"

    def validate(self) -> "RunConfig":
        for name in ("eval_batch", "act_batch", "max_answer_tokens", "max_revise_tokens",
                     "max_decide_tokens", "failure_chars", "max_skill_chars", "recent",
                     "heldout_every", "heldout_batch"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"run.{name} must be an integer >= 1, got {v!r}")
        if self.max_failures < 0:
            raise ValueError(f"run.max_failures must be >= 0, got {self.max_failures}")
        for name in ("temperature", "heldout_temperature"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"run.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"run.top_p must be in (0, 1], got {self.top_p}")
        return self

    @classmethod
    def from_config(cls, c) -> "RunConfig":
        d = dict(c)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown run settings {sorted(unknown)}")
        return cls(**d).validate()


# ----------------------------------------------------------------------------- engine
class SkillLLM:
    """(system, user) chat prompts -> completions through the chat engine.

    Loading, chat-template encoding, batched generation, decoding and stop ids are `self.chat`
    (a `jaxsocial.agents.chat.ChatModel`); here: the run's sampling settings, the per-row caps
    over live rows and the decision grammar."""

    def __init__(self, model, tokenizer, config: RunConfig):
        self._attach(ChatModel(model, tokenizer), config)

    def _attach(self, chat: ChatModel, config: RunConfig) -> None:
        self.chat, self.config = chat, config
        self.model, self.tokenizer = chat.model, chat.tokenizer
        self.stop_ids, self.eot, self.pad = chat.stop_ids, chat.eot, chat.pad
        self._grammars = {}
        self.calls = 0

    @classmethod
    def from_chat(cls, chat: ChatModel, config: RunConfig) -> "SkillLLM":
        """A SkillLLM over an already loaded `ChatModel`."""
        llm = cls.__new__(cls)
        llm._attach(chat, config)
        return llm

    @classmethod
    def load(cls, checkpoint: str, config: RunConfig) -> "SkillLLM":
        if not checkpoint:
            raise ValueError("llm.checkpoint is empty: give a checkpoint path or 'tiny'")
        return cls.from_chat(ChatModel.load(checkpoint, dtype=config.dtype), config)

    def encode(self, pairs: Sequence[tuple[str, str]]):
        """[(system, user)] -> left-padded (ids [B, L] int32, mask [B, L] int32)."""
        return self.chat.encode([messages(user, system) for system, user in pairs])

    def complete(self, pairs: Sequence[tuple[str, str]], key, caps: Sequence[int], grammar=None,
                 limit: int = 0, temperature: float | None = None):
        """-> (texts [B], tokens [B] int32). Row b generates at most caps[b] tokens (stop token
        included); rows with cap 0 are not generated (""/0). The call decodes `limit` tokens
        (default: the largest cap; a fixed limit per kind of call keeps one compiled program
        per kind) and cuts each row at its cap. The batch is padded to a power of two (padding
        rows repeat row 0 and are discarded) so few programs are compiled."""
        caps = np.asarray(caps, np.int64)
        live = [b for b in range(len(pairs)) if caps[b] > 0]
        texts, toks = [""] * len(pairs), np.zeros(len(pairs), np.int32)
        if not live:
            return texts, toks
        c = self.config
        out = self.chat.complete(
            [messages(pairs[b][1], pairs[b][0]) for b in live], key,
            max(int(caps[live].max()), int(limit)), caps=caps[live], grammar=grammar,
            pad_batch=True, temperature=c.temperature if temperature is None else temperature,
            top_p=c.top_p, prompt_bucket=c.prompt_bucket)
        self.calls += 1
        for r, b in enumerate(live):
            texts[b], toks[b] = out.texts[r], out.lengths[r]
        return texts, toks

    def decide_grammar(self, num_agents: int, social: bool):
        if not self.config.grammar:
            return None
        k = (num_agents, social)
        if k not in self._grammars:
            enc = self.chat.token_ids
            alts = [[g.Tokens(enc("LEARN: revise"))], [g.Tokens(enc("LEARN: skip"))]]
            if social:
                alts.append([g.Tokens(enc("LEARN: observe ")),
                             g.OneOf(tuple(tuple(enc(str(j))) for j in range(num_agents)))])
            self._grammars[k] = self.chat.grammar(alts)
        return self._grammars[k]


# ----------------------------------------------------------------------------- prompts
def render_decide_prompt(agent: int, num_agents: int, t: int, num_rounds: int, remaining: int,
                         own: float | None, own_recent: Sequence[float], peers: Sequence[tuple],
                         social: bool) -> str:
    """User message of the LLM decision. own: the deployed skill's training score (None: not
    scored yet); peers: ((j, latest skill score or None, recent acting scores), ...)."""
    def rec(xs):
        return ", ".join(f"{x:.2f}" for x in xs) if len(xs) else "none yet"
    lines = [f"You are agent {agent} of {num_agents}. Round {t + 1} of {num_rounds}. "
             f"Tokens left this round: {remaining}.",
             "Your skill's training score: " + ("not scored yet" if own is None else
                                                f"{own:.2f}")
             + f". Your recent task scores: {rec(own_recent)}."]
    opts = "LEARN: revise | LEARN: skip"
    if social:
        lines.append("Other agents (latest skill score; recent task scores):")
        for j, s, r in peers:
            lines.append(f"  agent {j}: " + ("not scored yet" if s is None else f"{s:.2f}")
                         + f"; {rec(r)}")
        opts = "LEARN: revise | LEARN: observe <agent> | LEARN: skip"
    lines.append(f"Answer with one line: {opts}")
    return "\n".join(lines)


def parse_decision(text: str, num_agents: int) -> tuple[int, int, bool]:
    """-> (kind, target, ok); the LAST `LEARN: ...` counts; malformed -> (SKIP, 0, False)."""
    m = list(_LEARN_RE.finditer(text))
    if not m:
        return se.SKIP, 0, False
    word, j = m[-1].group(1).lower(), m[-1].group(2)
    if word == "observe":
        if j is None or not 0 <= int(j) < num_agents:
            return se.SKIP, 0, False
        return se.OBSERVE, int(j), True
    return (se.REVISE if word == "revise" else se.SKIP), 0, True


def render_revise_prompt(skill: str, score: float | None, failures: Sequence[tuple],
                         chars: int) -> str:
    """User message of the revise step. failures: ((prompt, failed instruction ids), ...)."""
    lines = ["Current skill:", skill or "(empty)",
             "Training score: " + ("not measured yet" if score is None else f"{score:.2f}")]
    if failures:
        lines.append("Requests it failed, with the instructions that were broken:")
        for k, (prompt, failed) in enumerate(failures, 1):
            p = prompt if len(prompt) <= chars else prompt[:chars] + "..."
            lines.append(f"{k}. {p}\n   broken: {', '.join(failed)}")
    lines.append("Write the improved skill.")
    return "\n".join(lines)


def clean_skill(text: str, max_chars: int) -> str:
    """A revised skill from a completion: stripped, a leading 'skill:' label dropped, cut."""
    t = text.strip()
    t = re.sub(r"^(?:new |improved )?skill\s*:\s*", "", t, flags=re.IGNORECASE)
    return t[:max_chars].strip()


# ----------------------------------------------------------------------------- run loop
@dataclasses.dataclass
class Run:
    """One population's run. Arrays are host NumPy; texts are the skill table's texts."""

    decider: str
    state: se.EnvState
    texts: list  # [S'] skill texts by id (S' = num_skills)
    kind: np.ndarray  # [T, N] performed learning action
    target: np.ndarray  # [T, N]
    learn_tokens: np.ndarray  # [T, N]
    act_tokens: np.ndarray  # [T, N]
    reward: np.ndarray  # [T, N] acting score (prompt-level loose)
    deployed: np.ndarray  # [T, N] deployed skill after each round
    heldout_rounds: list  # rounds after which held-out was measured (0 = before round 1)
    heldout: dict  # metric -> [E, N] held-out score of the deployed skills
    malformed: int = 0  # LLM decisions that did not parse (played as SKIP)
    empty_revisions: int = 0  # rewrites that produced no text (revision failed)
    invalid: int = 0  # decisions refused by the env (over budget, bad observe target)
    samples: list = dataclasses.field(default_factory=list)


class HeldoutCache:
    """Held-out scores by skill text: {text: {metric: mean over the held-out prompts}}.

    Held-out answers are decoded greedily (`heldout_temperature`, default 0), so a skill's score
    is a function of its text: a copy scores as its original and the cache is shared by every
    decider and seed of a run. All uncached texts are answered in batched calls of at most
    `heldout_batch` rows. Tokens spent here are a measurement, charged to no agent.
    """

    METRICS = ("prompt_strict", "prompt_loose", "instr_strict", "instr_loose")

    def __init__(self, llm: SkillLLM, examples: Sequence[ifbench.Example], cfg: RunConfig):
        self.llm, self.examples, self.cfg = llm, list(examples), cfg
        self.scores: dict = {}
        self.tokens = 0

    def score(self, texts: Sequence[str]) -> list[dict]:
        todo = [t for t in dict.fromkeys(texts) if t not in self.scores]
        rows = [(t, ex) for t in todo for ex in self.examples]
        per = {t: [] for t in todo}
        cap = self.cfg.max_answer_tokens
        key = jax.random.key(self.cfg.heldout_seed)
        for lo in range(0, len(rows), self.cfg.heldout_batch):
            chunk = rows[lo:lo + self.cfg.heldout_batch]
            out, tok = self.llm.complete([(t, ex.prompt) for t, ex in chunk],
                                         jax.random.fold_in(key, lo), [cap] * len(chunk),
                                         limit=cap, temperature=self.cfg.heldout_temperature)
            self.tokens += int(tok.sum())
            for (t, ex), o in zip(chunk, out):
                per[t].append(ifbench.check(ex, o))
        for t in todo:
            self.scores[t] = {m: float(np.mean([getattr(s, m) for s in per[t]]))
                              for m in self.METRICS}
        return [self.scores[t] for t in texts]


def run_population(llm: SkillLLM, key, params: se.EnvParams, decider: str,
                   train: Sequence[ifbench.Example], heldout: HeldoutCache, cfg: RunConfig,
                   seed_skills: Sequence[str] = SEED_SKILLS, ucb_kw: dict | None = None,
                   record: int = 2) -> Run:
    """Play one population (key = the seed's key) with `decider` in {solo, llm, ucb, random}.

    Keys: round t uses fold_in(key, t) split into (decide, revise, eval-pick, eval-gen,
    act-pick, act-gen); the acting prompts depend only on (key, t), so every decider with the
    same seed acts on the same prompts. Training score (what agents see, eval and act) is
    IFBench's prompt-level loose accuracy.
    """
    params.validate()
    if decider not in se.DECIDERS:
        raise ValueError(f"unknown decider {decider!r}; choose one of {se.DECIDERS}")
    if not seed_skills:
        raise ValueError("seed_skills is empty")
    n, T = params.num_agents, params.num_rounds
    ntr = len(train)
    if cfg.eval_batch > ntr or cfg.act_batch > ntr:
        raise ValueError(f"eval_batch={cfg.eval_batch} / act_batch={cfg.act_batch} exceed the "
                         f"{ntr} training prompts")
    obs, state = se.reset_jit(params)
    texts = [seed_skills[i % len(seed_skills)] for i in range(n)]
    failures: dict = {}  # skill id -> [(prompt, failed ids)] from its latest scoring
    recent = [[] for _ in range(n)]
    policy = None if decider == "llm" else se.get(decider, **(ucb_kw or {}) if decider == "ucb"
                                                 else {})
    pstate = None if policy is None else policy.init(params)
    logs = {f: np.zeros((T, n), d) for f, d in (("kind", np.int32), ("target", np.int32),
                                                   ("learn_tokens", np.int32),
                                                   ("act_tokens", np.int32),
                                                   ("reward", np.float32),
                                                   ("deployed", np.int32))}
    h_rounds, h_scores = [], {m: [] for m in ("prompt_strict", "prompt_loose", "instr_strict",
                                              "instr_loose")}
    run = Run(decider, state, texts, **{k: v for k, v in logs.items()},
              heldout_rounds=h_rounds, heldout=h_scores)

    def measure(t):
        sc = heldout.score([texts[int(i)] for i in np.asarray(state.deployed)])
        h_rounds.append(t)
        for m in h_scores:
            h_scores[m].append([s[m] for s in sc])

    measure(0)
    for t in range(T):
        ks = jax.random.split(jax.random.fold_in(key, t), 6)
        dep = np.asarray(state.deployed)
        means = np.asarray(se.skill_means(state))
        cnt = np.asarray(state.score_cnt)
        latest = np.asarray(state.latest)
        remaining = np.asarray(state.remaining)
        avail = np.maximum(remaining - params.reserve, 0)
        # 1. decide
        decide_tok = np.zeros(n, np.int32)
        if policy is None:
            prompts = []
            for i in range(n):
                peers = tuple((j, float(means[latest[j]]) if cnt[latest[j]] else None,
                               recent[j][-cfg.recent:]) for j in range(n) if j != i)
                prompts.append((DECIDE_SYSTEM, render_decide_prompt(
                    i, n, t, T, int(remaining[i]),
                    float(means[dep[i]]) if cnt[dep[i]] else None,
                    recent[i][-cfg.recent:], peers, params.social)))
            outs, decide_tok = llm.complete(prompts, ks[0], [cfg.max_decide_tokens] * n,
                                            llm.decide_grammar(n, params.social))
            kind = np.zeros(n, np.int32)
            target = np.zeros(n, np.int32)
            for i, o in enumerate(outs):
                kind[i], target[i], ok = parse_decision(o, n)
                run.malformed += not ok
            if len(run.samples) < record:
                run.samples.append({"round": t, "prompt": prompts[0][1], "decision": outs[0]})
        else:
            k_, t_ = policy.act(ks[0], pstate, obs, params)
            kind, target = np.asarray(k_, np.int32), np.asarray(t_, np.int32)
        # 2. revise: rewrite + evaluate, capped by what learning may still spend
        left = avail - decide_tok
        revising = [i for i in range(n) if kind[i] == se.REVISE and left[i] > 0]
        rev_tok = np.zeros(n, np.int32)
        rev_ok = np.zeros(n, bool)
        ev_sum = np.zeros(n, np.float32)
        ev_cnt = np.zeros(n, np.float32)
        new_text = {}
        if revising:
            prompts = [(REVISE_SYSTEM, render_revise_prompt(
                texts[dep[i]], float(means[dep[i]]) if cnt[dep[i]] else None,
                failures.get(int(dep[i]), [])[:cfg.max_failures], cfg.failure_chars))
                for i in revising]
            caps = [min(cfg.max_revise_tokens, int(left[i])) for i in revising]
            outs, tok = llm.complete(prompts, ks[1], caps, limit=cfg.max_revise_tokens)
            picks = np.asarray(jax.vmap(lambda k: jax.random.permutation(k, ntr)[:cfg.eval_batch])(
                jax.random.split(ks[2], n)))
            eval_rows, eval_caps, owners = [], [], []
            for r, i in enumerate(revising):
                rev_tok[i] = tok[r]
                skill = clean_skill(outs[r], cfg.max_skill_chars)
                cap = min(cfg.max_answer_tokens, int(left[i] - tok[r]) // cfg.eval_batch)
                if not skill:
                    run.empty_revisions += 1
                    continue
                if cap < 1:
                    continue
                new_text[i] = skill
                for p in picks[i]:
                    eval_rows.append((skill, train[int(p)].prompt))
                    eval_caps.append(cap)
                    owners.append((i, int(p)))
            if eval_rows:
                outs_e, tok_e = llm.complete(eval_rows, ks[3], eval_caps,
                                             limit=cfg.max_answer_tokens)
                fails = {i: [] for i in new_text}
                for (i, p), o, tk in zip(owners, outs_e, tok_e):
                    sc = ifbench.check(train[p], o)
                    rev_tok[i] += tk
                    ev_sum[i] += sc.prompt_loose
                    ev_cnt[i] += 1
                    if not sc.prompt_loose:
                        fails[i].append((train[p].prompt, ifbench.failed_instructions(train[p],
                                                                                       sc)))
                for i in new_text:
                    rev_ok[i] = True
                    new_text[i] = (new_text[i], fails[i])
        action = se.learn_action(kind, target, decide_tok, rev_tok, rev_ok, ev_sum, ev_cnt)
        before = obs
        obs, state, info = se.learn_jit(state, action, params)
        new_skill = np.asarray(info["new_skill"])
        performed = np.asarray(info["kind"])
        run.invalid += int(np.asarray(info["invalid"]).sum())
        for i in range(n):  # host-side text table follows the env's slot numbering
            s_id = int(new_skill[i])
            if s_id < 0:
                continue
            assert s_id == len(texts), (s_id, len(texts))
            if performed[i] == se.OBSERVE:
                src = int(latest[target[i]])
                texts.append(texts[src])
                failures[s_id] = failures.get(src, [])
            else:
                texts.append(new_text[i][0])
                failures[s_id] = new_text[i][1]
        if policy is not None:
            gain = np.where(performed == se.OBSERVE, means[latest[np.clip(target, 0, n - 1)]],
                            ev_sum / np.maximum(ev_cnt, 1)).astype(np.float32)
            pstate = policy.update(pstate, before, {"kind": info["kind"],
                                                    "target": jnp.asarray(target),
                                                    "gain": jnp.asarray(gain)}, params)
        # 3. act on the round's shared prompts
        dep = np.asarray(state.deployed)
        rem = np.asarray(state.remaining)
        pick = np.asarray(jax.random.permutation(ks[4], ntr)[:cfg.act_batch])
        rows, caps = [], []
        for i in range(n):
            cap = min(cfg.max_answer_tokens, int(rem[i]) // cfg.act_batch)
            for p in pick:
                rows.append((texts[dep[i]], train[int(p)].prompt))
                caps.append(cap)
        outs_a, tok_a = llm.complete(rows, ks[5], caps, limit=cfg.max_answer_tokens)
        a_tok = np.zeros(n, np.int32)
        a_sum = np.zeros(n, np.float32)
        a_cnt = np.zeros(n, np.float32)
        acted = np.zeros(n, bool)
        for r, (o, tk) in enumerate(zip(outs_a, tok_a)):
            i, p = divmod(r, cfg.act_batch)
            if caps[r] < 1:
                continue
            sc = ifbench.check(train[int(pick[p])], o)
            a_tok[i] += tk
            a_sum[i] += sc.prompt_loose
            a_cnt[i] += 1
            acted[i] = True
            if not sc.prompt_loose:  # newest first, a few kept
                fl = failures.setdefault(int(dep[i]), [])
                fl.insert(0, (train[int(pick[p])].prompt,
                              ifbench.failed_instructions(train[int(pick[p])], sc)))
                del fl[cfg.max_failures:]
        obs, state, reward, info_a = se.act_jit(
            state, se.ActAction(jnp.asarray(a_tok), jnp.asarray(a_sum), jnp.asarray(a_cnt),
                                jnp.asarray(acted)), params)
        reward = np.asarray(reward)
        for i in range(n):
            if acted[i]:
                recent[i].append(float(reward[i]))
        run.kind[t], run.target[t] = performed, target
        run.learn_tokens[t] = np.asarray(info["tokens"])
        run.act_tokens[t] = np.asarray(info_a["tokens"])
        run.reward[t] = reward
        run.deployed[t] = np.asarray(state.deployed)
        if (t + 1) % cfg.heldout_every == 0 or t == T - 1:
            measure(t + 1)
    run.state = jax.tree.map(np.asarray, state)
    return run


# ----------------------------------------------------------------------------- metrics
def population_metrics(run: Run, params: se.EnvParams) -> dict:
    """One population's numbers (the paper's stage-2 metrics)."""
    n, T = params.num_agents, params.num_rounds
    lin = se.lineage(run.state)
    kinds = run.kind
    hs = {m: np.asarray(v, np.float64).mean(-1) for m, v in run.heldout.items()}
    return {
        "heldout_strict": float(hs["prompt_strict"][-1]),
        "heldout_loose": float(hs["prompt_loose"][-1]),
        "heldout_instr_loose": float(hs["instr_loose"][-1]),
        "heldout_strict_mean_over_rounds": float(hs["prompt_strict"][1:].mean()),
        "heldout_loose_mean_over_rounds": float(hs["prompt_loose"][1:].mean()),
        "learn_tokens": float(run.learn_tokens.sum()),
        "act_tokens": float(run.act_tokens.sum()),
        "total_tokens": float(run.learn_tokens.sum() + run.act_tokens.sum()),
        "train_reward": float(run.reward.mean()),
        "observe_rate": float((kinds == se.OBSERVE).mean()),
        "revise_rate": float((kinds == se.REVISE).mean()),
        "skip_rate": float((kinds == se.SKIP).mean()),
        "copy_then_revise_share": lin["copy_then_revise_share"],
        "via_copy_share": lin["via_copy_share"],
        "founding_lineages": float(lin["founding_lineages"]),
        "malformed_rate": run.malformed / (n * T),
        "num_skills": float(len(run.texts)),
    }


def heldout_curve(run: Run, metric: str = "prompt_loose") -> tuple[np.ndarray, np.ndarray]:
    """(cumulative population tokens [E], mean held-out score [E]) at the measured rounds."""
    cum = np.concatenate([[0.0], np.cumsum((run.learn_tokens + run.act_tokens).sum(-1))])
    return (cum[np.asarray(run.heldout_rounds)],
            np.asarray(run.heldout[metric], np.float64).mean(-1))


def compare_matched(runs: Sequence[Run], refs: Sequence[Run], metric: str = "prompt_loose"
                    ) -> dict:
    """Paired by seed vs the reference (solo): held-out accuracy gap at matched tokens
    C* = min(final tokens of both) (interpolated on the held-out curves), the final gap, and the
    learning-token saving (1 - learn / learn_ref). Mean +- SEM over seeds, one-sample t-test."""
    gap_c, gap_f, save = [], [], []
    for r, s in zip(runs, refs):
        cr, ar = heldout_curve(r, metric)
        cs, as_ = heldout_curve(s, metric)
        c_star = min(cr[-1], cs[-1])
        gap_c.append(slm.reward_at_cost(cr, ar, c_star) - slm.reward_at_cost(cs, as_, c_star))
        gap_f.append(ar[-1] - as_[-1])
        lr, ls = r.learn_tokens.sum(), s.learn_tokens.sum()
        save.append(1.0 - lr / ls if ls > 0 else float("nan"))
    out = {}
    for name, x in (("gap_matched", gap_c), ("gap_final", gap_f), ("learn_saving", save)):
        m, se_ = slm.mean_sem(x)
        _, p = slm.one_sample_ttest(x)
        out.update({name: m, name + "_sem": se_, name + "_p": p})
    out["gap_matched_per_seed"] = [float(x) for x in gap_c]
    return out
