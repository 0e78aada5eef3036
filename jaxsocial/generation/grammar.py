"""Token-level finite-state machines for constrained decoding, and a compiler that builds them.

A `Grammar` is a deterministic automaton over token ids, stored as arrays so it runs inside jit:

    allowed    [S, V] bool   token v may be emitted in state s
    next_state [S, V] int32  state after emitting v in s (DEAD for disallowed v)
    start      []     int32  initial state
    accepting  [S]    bool   a complete output may end in s

State 0 is the dead state (nothing allowed, not accepting). At each decoding step the logits of
row b are masked with `allowed[state[b]]` and the state advances with `next_state[state[b], tok]`.
A row whose state allows nothing has finished its output (see `generate`).

The compiler (`compile_grammar`) is in-house, over token-id sequences rather than regexes over
text (outlines-core's Index would enumerate every tokenization of a regex; agents here only need
the canonical tokenization of a few keywords): a pattern is a sequence of parts,

    Tokens(ids)                     a literal token sequence, e.g. the ids of "like"
    OneOf([ids, ids, ...])          one of several literal sequences (post ids, user names)
    Repeat(token_ids, lo, hi)       lo..hi tokens from a set (a number = 1..3 digit tokens)
    free_text(max_tokens, exclude)  1..max_tokens tokens from the whole vocabulary minus exclude

and a grammar is a list of alternative patterns, each optionally closed by one of
`end_token_ids` (e.g. <|eot_id|>). Patterns become an NFA (epsilon moves + token-set moves)
that is determinised by subset construction (over classes of tokens that every token set
of the patterns treats alike, so a 128K vocabulary costs little), so alternatives may share
prefixes ("like 3" / "like 30", "post:" / "poke").
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence, Tuple, Union

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

DEAD = 0


@flax.struct.dataclass
class Grammar:
    """Token FSM as arrays (see module docstring). All fields are pytree leaves, so grammars of
    the same [S, V] shape share one compiled generate program."""

    allowed: Array      # [S, V] bool
    next_state: Array   # [S, V] int32
    start: Array        # [] int32
    accepting: Array    # [S] bool

    @property
    def num_states(self) -> int:
        return self.allowed.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.allowed.shape[1]


def make_grammar(allowed, next_state, start, accepting) -> Grammar:
    """Validate host arrays and build a `Grammar` (ValueError names the bad value)."""
    allowed = np.asarray(allowed)
    next_state = np.asarray(next_state)
    accepting = np.asarray(accepting)
    if allowed.ndim != 2 or allowed.dtype != np.bool_:
        raise ValueError(f"allowed must be a [S, V] bool array, got {allowed.dtype}{allowed.shape}")
    if next_state.shape != allowed.shape:
        raise ValueError(f"next_state shape {next_state.shape} != allowed shape {allowed.shape}")
    if not np.issubdtype(next_state.dtype, np.integer):
        raise ValueError(f"next_state must be integer, got {next_state.dtype}")
    s = allowed.shape[0]
    if next_state.size and (next_state.min() < 0 or next_state.max() >= s):
        raise ValueError(f"next_state values must lie in [0, {s}), got range "
                         f"[{next_state.min()}, {next_state.max()}]")
    if accepting.shape != (s,):
        raise ValueError(f"accepting must have shape ({s},), got {accepting.shape}")
    start = int(start)
    if not 0 <= start < s:
        raise ValueError(f"start state {start} is outside [0, {s})")
    return Grammar(allowed=jnp.asarray(allowed, bool),
                   next_state=jnp.asarray(next_state, jnp.int32),
                   start=jnp.asarray(start, jnp.int32),
                   accepting=jnp.asarray(accepting, bool))


# ----------------------------------------------------------------------------------------------
# Running a grammar (pure array code, usable inside jit).


def advance(grammar: Grammar, state: Array, tokens: Array, valid: Optional[Array] = None) -> Array:
    """state [B] int32, tokens [B] -> next state [B]; rows with valid=False keep their state."""
    nxt = grammar.next_state[state, tokens]
    return nxt if valid is None else jnp.where(valid, nxt, state)


def run(grammar: Grammar, tokens: Array, mask: Optional[Array] = None) -> Tuple[Array, Array]:
    """Replay responses through the FSM.

    tokens [B, N], mask [B, N] bool (False = padding after the response, ignored).
    Returns (states [B, N] int32 = state *before* token t, ok [B, N] bool = token t was allowed).
    """
    chex.assert_rank(tokens, 2)
    b, _ = tokens.shape
    if mask is None:
        mask = jnp.ones(tokens.shape, bool)
    mask = mask.astype(bool)

    def step(state, xs):
        tok, valid = xs
        ok = grammar.allowed[state, tok] | ~valid
        return advance(grammar, state, tok, valid), (state, ok)

    init = jnp.full((b,), grammar.start, jnp.int32)
    final, (states, ok) = jax.lax.scan(step, init, (tokens.T.astype(jnp.int32), mask.T))
    return states.T, ok.T


def step_states(grammar: Grammar, tokens: Array, mask: Optional[Array] = None) -> Array:
    """The FSM state in force at each step of a response: states [B, N] int32 (the state
    *before* token t). What a trajectory stores instead of [B, N, V] masks: the mask of step t
    is `masks_from_states(grammar, states)[:, t]`, rebuilt where (and as little as) needed."""
    return run(grammar, tokens, mask)[0]


def masks_from_states(grammar: Grammar, states: Array) -> Array:
    """states [...] int32 -> allowed [..., V] bool (gather rows of the FSM table)."""
    return grammar.allowed[states]


def step_masks(grammar: Grammar, tokens: Array, mask: Optional[Array] = None) -> Array:
    """The grammar mask in force at each step of a response: allowed [B, N, V] bool.

    `allowed[b, t]` = `grammar.allowed[state before token t]`: exactly the mask the sampler used,
    so `sampling.token_logprobs(logits, tokens, config, allowed)` re-scores a generated response.
    [B, N, V] grows with the vocabulary: the RL code keeps `step_states` and rebuilds masks per
    chunk instead.
    """
    return masks_from_states(grammar, step_states(grammar, tokens, mask))


def grammar_from_masks(allowed) -> Tuple[Grammar, Array]:
    """Arbitrary per-step masks allowed [B, N, V] bool -> (Grammar, states [B, N] int32) with
    `masks_from_states(grammar, states) == allowed`: one FSM state per (row, step), for tests
    and callers that hold explicit masks. (Its next_state table is all DEAD: use the states
    directly, do not replay tokens through it.)"""
    allowed = np.asarray(allowed, bool)
    if allowed.ndim != 3:
        raise ValueError(f"allowed must be [B, N, V] bool, got shape {allowed.shape}")
    b, n, v = allowed.shape
    table = np.concatenate([np.zeros((1, v), bool), allowed.reshape(b * n, v)])
    g = make_grammar(table, np.zeros(table.shape, np.int32), 0, np.zeros(b * n + 1, bool))
    states = jnp.asarray(1 + np.arange(b * n, dtype=np.int32).reshape(b, n))
    return g, states


def accepts(grammar: Grammar, tokens: Array, mask: Optional[Array] = None) -> Array:
    """[B] bool: every unmasked token was allowed and the final state is accepting."""
    if mask is None:
        mask = jnp.ones(tokens.shape, bool)
    states, ok = run(grammar, tokens, mask)
    b, n = tokens.shape
    last = jnp.maximum(mask.sum(axis=1) - 1, 0)
    last_state = states[jnp.arange(b), last]
    last_tok = tokens[jnp.arange(b), last]
    final = jnp.where(mask.any(axis=1), grammar.next_state[last_state, last_tok], grammar.start)
    return ok.all(axis=1) & grammar.accepting[final]


# ----------------------------------------------------------------------------------------------
# Compiler: patterns of token-id parts -> NFA -> DFA arrays.


@dataclasses.dataclass(frozen=True)
class Tokens:
    """A literal token-id sequence."""
    ids: Tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "ids", tuple(int(i) for i in self.ids))


@dataclasses.dataclass(frozen=True)
class OneOf:
    """Exactly one of several literal token-id sequences (an empty sequence makes it optional)."""
    options: Tuple[Tuple[int, ...], ...]

    def __post_init__(self):
        opts = tuple(tuple(int(i) for i in o) for o in self.options)
        if not opts:
            raise ValueError("OneOf needs at least one option")
        object.__setattr__(self, "options", opts)


@dataclasses.dataclass(frozen=True)
class Repeat:
    """min_tokens..max_tokens tokens, each from `token_ids` (None = whole vocabulary) minus
    `exclude`. Bounded so a constrained output always finishes within a known length."""
    token_ids: Optional[Tuple[int, ...]]
    min_tokens: int
    max_tokens: int
    exclude: Tuple[int, ...] = ()

    def __post_init__(self):
        if self.token_ids is not None:
            object.__setattr__(self, "token_ids", tuple(int(i) for i in self.token_ids))
        object.__setattr__(self, "exclude", tuple(int(i) for i in self.exclude))
        if not 0 <= self.min_tokens <= self.max_tokens or self.max_tokens < 1:
            raise ValueError(f"Repeat needs 0 <= min_tokens <= max_tokens and max_tokens >= 1, "
                             f"got min_tokens={self.min_tokens} max_tokens={self.max_tokens}")


def free_text(max_tokens: int, exclude: Iterable[int] = (), min_tokens: int = 1) -> Repeat:
    """Free text: min_tokens..max_tokens tokens from the whole vocabulary minus `exclude`
    (exclude the stop and special tokens so the text cannot end the output by itself)."""
    return Repeat(None, min_tokens, max_tokens, tuple(exclude))


Part = Union[Tokens, OneOf, Repeat, Sequence[int]]


class _NFA:
    def __init__(self):
        self.eps: list = []      # [src] -> list of dst
        self.moves: list = []    # [src] -> list of (token id array, dst)

    def node(self) -> int:
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def chain(self, src: int, ids: Sequence[int]) -> int:
        for tok in ids:
            dst = self.node()
            self.moves[src].append((np.asarray([tok], np.int64), dst))
            src = dst
        return src


def _token_set(part: Repeat, vocab_size: int) -> np.ndarray:
    keep = np.zeros(vocab_size, bool)
    if part.token_ids is None:
        keep[:] = True
    else:
        keep[np.asarray(part.token_ids, np.int64)] = True
    if part.exclude:
        keep[np.asarray(part.exclude, np.int64)] = False
    if not keep.any():
        raise ValueError(f"Repeat part {part} allows no token")
    return np.flatnonzero(keep)


def _check_ids(ids: Sequence[int], vocab_size: int, what: str) -> None:
    for i in ids:
        if not 0 <= int(i) < vocab_size:
            raise ValueError(f"{what}: token id {i} is outside the vocabulary [0, {vocab_size})")


def compile_grammar(patterns: Sequence[Sequence[Part]], vocab_size: int,
                    end_token_ids: Iterable[int] = (), max_states: int = 4096) -> Grammar:
    """Compile alternative patterns into a `Grammar`.

    patterns: list of patterns; a pattern is a list of parts (`Tokens`, `OneOf`, `Repeat`, or a
      plain list of ints = `Tokens`). The output must match exactly one whole pattern.
    end_token_ids: if given, every pattern must be closed by one of these tokens (use the
      generation stop ids, e.g. <|eot_id|>); the row then stops on it. If empty, the output ends
      when the FSM reaches a state that allows nothing.

    Example, OASIS-style actions ("like <post id>", "post: <text>", "do_nothing"):
        compile_grammar([[LIKE, Repeat(digits, 1, 3)], [POST_COLON, free_text(40, specials)],
                         [DO_NOTHING]], vocab_size, end_token_ids=[EOT])
    """
    end_token_ids = tuple(int(e) for e in end_token_ids)
    _check_ids(end_token_ids, vocab_size, "end_token_ids")
    if not patterns:
        raise ValueError("compile_grammar needs at least one pattern")
    nfa = _NFA()
    start = nfa.node()
    final = nfa.node()
    end_set = np.asarray(end_token_ids, np.int64)
    for p_idx, pattern in enumerate(patterns):
        cur = nfa.node()
        nfa.eps[start].append(cur)
        for part in pattern:
            if isinstance(part, (Tokens, OneOf, Repeat)):
                pass
            elif isinstance(part, (list, tuple, np.ndarray)):
                part = Tokens(tuple(part))
            else:
                raise ValueError(f"pattern {p_idx}: unsupported part {part!r}; use Tokens, OneOf, "
                                 f"Repeat/free_text or a list of token ids")
            if isinstance(part, Tokens):
                _check_ids(part.ids, vocab_size, f"pattern {p_idx}")
                cur = nfa.chain(cur, part.ids)
            elif isinstance(part, OneOf):
                end = nfa.node()
                for opt in part.options:
                    _check_ids(opt, vocab_size, f"pattern {p_idx}")
                    nfa.eps[nfa.chain(cur, opt)].append(end)
                cur = end
            else:
                if part.token_ids is not None:
                    _check_ids(part.token_ids, vocab_size, f"pattern {p_idx}")
                ids = _token_set(part, vocab_size)
                end = nfa.node()
                for i in range(part.max_tokens):
                    if i >= part.min_tokens:
                        nfa.eps[cur].append(end)
                    nxt = nfa.node()
                    nfa.moves[cur].append((ids, nxt))
                    cur = nxt
                nfa.eps[cur].append(end)
                cur = end
        if end_token_ids:
            nfa.moves[cur].append((end_set, final))
        else:
            nfa.eps[cur].append(final)
    return _determinise(nfa, start, final, vocab_size, max_states)


def _closure(nfa: _NFA, nodes: np.ndarray) -> np.ndarray:
    """Epsilon closure of a bool node set [n]."""
    out = nodes.copy()
    stack = list(np.flatnonzero(nodes))
    while stack:
        for dst in nfa.eps[stack.pop()]:
            if not out[dst]:
                out[dst] = True
                stack.append(dst)
    return out


def _determinise(nfa: _NFA, start: int, final: int, vocab_size: int, max_states: int) -> Grammar:
    """Subset construction over alphabet *atoms*: classes of tokens that belong to exactly the
    same token sets of the NFA behave identically, so the DFA is built over the (few) atoms and
    expanded to the vocabulary at the end."""
    n = len(nfa.eps)
    sets, set_index = [], {}
    moves = [[] for _ in range(n)]   # [src] -> list of (set id, dst)
    for src in range(n):
        for ids, dst in nfa.moves[src]:
            ids = np.unique(ids)
            key = ids.tobytes()
            if key not in set_index:
                set_index[key] = len(sets)
                sets.append(ids)
            moves[src].append((set_index[key], dst))
    member = np.zeros((vocab_size, max(len(sets), 1)), bool)
    for j, ids in enumerate(sets):
        member[ids, j] = True
    uniq, atom_of = np.unique(np.packbits(member, axis=1), axis=0, return_inverse=True)
    atom_member = np.unpackbits(uniq, axis=1)[:, :member.shape[1]].astype(bool)  # [A, m]
    atom_of = atom_of.reshape(-1)

    init = np.zeros(n, bool)
    init[start] = True
    dfa_sets = [np.zeros(n, bool), _closure(nfa, init)]
    index = {dfa_sets[0].tobytes(): DEAD, dfa_sets[1].tobytes(): 1}
    atom_rows = [np.full(len(uniq), DEAD, np.int32)]
    todo = 1
    while todo < len(dfa_sets):
        cur = dfa_sets[todo]
        todo += 1
        succ = np.zeros((len(uniq), n), bool)   # raw successor nodes of every atom
        for src in np.flatnonzero(cur):
            for j, dst in moves[src]:
                succ[atom_member[:, j], dst] = True
        row = np.empty(len(uniq), np.int32)
        for a in range(len(uniq)):
            closed = _closure(nfa, succ[a]) if succ[a].any() else succ[a]
            key = closed.tobytes()
            if key not in index:
                if len(dfa_sets) >= max_states:
                    raise ValueError(f"grammar needs more than max_states={max_states} states")
                index[key] = len(dfa_sets)
                dfa_sets.append(closed)
            row[a] = index[key]
        atom_rows.append(row)
    next_state = np.stack(atom_rows)[:, atom_of]     # [S, V]
    accepting = np.array([bool(d[final]) for d in dfa_sets])
    return make_grammar(next_state != DEAD, next_state, 1, accepting)
