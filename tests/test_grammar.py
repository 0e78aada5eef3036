"""Grammar compiler and FSM replay against a pure-Python backtracking matcher."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.generation import grammar as gr

V = 40
END = 2
DIGITS = tuple(range(20, 30))
# "like <1-3 digits>", "like_post <id>" style shared prefixes, "post: <free text>", "noop".
PATTERNS = [
    [[10], gr.Repeat(DIGITS, 1, 3)],
    [[10, 11], gr.OneOf([(20,), (21, 22)])],
    [gr.Tokens((12, 13)), gr.free_text(4, exclude=(END, 0, 1))],
    [[14]],
]


def ref_match(pattern, seq, vocab, end_ids):
    """Does `seq` (list of ints) match the whole pattern (+ an end token if end_ids)?"""
    def parts_match(parts, s):
        if not parts:
            if end_ids:
                return len(s) == 1 and s[0] in end_ids
            return not s
        part, rest = parts[0], parts[1:]
        if isinstance(part, (list, tuple)):
            part = gr.Tokens(tuple(part))
        if isinstance(part, gr.Tokens):
            n = len(part.ids)
            return tuple(s[:n]) == part.ids and parts_match(rest, s[n:])
        if isinstance(part, gr.OneOf):
            return any(tuple(s[:len(o)]) == o and parts_match(rest, s[len(o):])
                       for o in part.options)
        ok = set(range(vocab) if part.token_ids is None else part.token_ids) - set(part.exclude)
        for n in range(part.min_tokens, part.max_tokens + 1):
            if n <= len(s) and all(t in ok for t in s[:n]) and parts_match(rest, s[n:]):
                return True
        return False
    return parts_match(list(pattern), list(seq))


def ref_accepts(patterns, seq, vocab, end_ids):
    return any(ref_match(p, seq, vocab, end_ids) for p in patterns)


@pytest.fixture(scope="module")
def grammar():
    return gr.compile_grammar(PATTERNS, V, end_token_ids=[END])


def _random_sequences(rs, n, max_len, alphabet):
    lens = rs.randint(1, max_len + 1, n)
    return [list(rs.choice(alphabet, size=k)) for k in lens]


def _pad(seqs, n):
    tokens = np.zeros((len(seqs), n), np.int32)
    mask = np.zeros((len(seqs), n), bool)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = s
        mask[i, :len(s)] = True
    return tokens, mask


def _valid_sequences():
    """Every string of the language with free text over a small sub-alphabet."""
    out = [[10] + list(d) + [END] for k in (1, 2, 3) for d in itertools.product((20, 25, 29),
                                                                                 repeat=k)]
    out += [[10, 11, 20, END], [10, 11, 21, 22, END], [14, END]]
    out += [[12, 13] + list(t) + [END] for k in (1, 2, 4) for t in itertools.product(
        (3, 10, 39), repeat=k)]
    return out


def test_all_valid_sequences_accepted(grammar):
    seqs = _valid_sequences()
    assert all(ref_accepts(PATTERNS, s, V, (END,)) for s in seqs)
    tokens, mask = _pad(seqs, 8)
    assert np.asarray(gr.accepts(grammar, jnp.asarray(tokens), jnp.asarray(mask))).all()


def test_accepts_agrees_with_reference_on_random_sequences(grammar):
    rs = np.random.RandomState(0)
    alphabet = np.array([0, 2, 3, 10, 11, 12, 13, 14, 20, 21, 22, 29, 39])
    seqs = _random_sequences(rs, 3000, 8, alphabet)
    # Add near-misses of valid strings (one token changed / dropped / appended).
    for s in _valid_sequences():
        i = rs.randint(len(s))
        seqs += [s[:i] + [int(rs.choice(alphabet))] + s[i + 1:], s[:i] + s[i + 1:], s + [END]]
    seqs = [s for s in seqs if s]
    tokens, mask = _pad(seqs, 9)
    ours = np.asarray(gr.accepts(grammar, jnp.asarray(tokens), jnp.asarray(mask)))
    ref = np.array([ref_accepts(PATTERNS, s, V, (END,)) for s in seqs])
    assert ref.sum() > 50 and (~ref).sum() > 50
    bad = np.flatnonzero(ours != ref)
    assert bad.size == 0, f"disagree on {[seqs[i] for i in bad[:5]]}"


def ref_viable(pattern, seq, vocab, end_ids):
    """Can `seq` be extended to a string matching the pattern (+ end token)?"""
    def parts_prefix(parts, s):
        if not s:
            return True
        if not parts:
            return len(s) == 1 and s[0] in end_ids
        part, rest = parts[0], parts[1:]
        if isinstance(part, (list, tuple)):
            part = gr.Tokens(tuple(part))
        options = [part.ids] if isinstance(part, gr.Tokens) else (
            part.options if isinstance(part, gr.OneOf) else None)
        if options is not None:
            for o in options:
                n = min(len(o), len(s))
                if tuple(s[:n]) == o[:n] and (n < len(o) or parts_prefix(rest, s[n:])):
                    return True
            return False
        ok = set(range(vocab) if part.token_ids is None else part.token_ids) - set(part.exclude)
        for n in range(0, part.max_tokens + 1):
            if n > len(s) or not all(t in ok for t in s[:n]):
                break
            if n == len(s) or (n >= part.min_tokens and parts_prefix(rest, s[n:])):
                return True
        return False
    return parts_prefix(list(pattern), list(seq))


def test_allowed_is_exactly_the_set_of_viable_next_tokens(grammar):
    """allowed[state after prefix] == {v : prefix + v can still be completed}."""
    valid = _valid_sequences()
    prefixes = sorted({tuple(s[:i]) for s in valid for i in range(len(s))})
    tokens, mask = _pad([list(p) + [0] for p in prefixes], 8)
    masks = np.asarray(gr.step_masks(grammar, jnp.asarray(tokens), jnp.asarray(mask)))
    for i, prefix in enumerate(prefixes):
        viable = np.array([any(ref_viable(p, list(prefix) + [v], V, (END,)) for p in PATTERNS)
                           for v in range(V)])
        np.testing.assert_array_equal(masks[i, len(prefix)], viable, err_msg=f"prefix {prefix}")


def test_dead_state_and_start():
    g = gr.compile_grammar([[[5, 6]]], 8)  # no end token: output ends when nothing is allowed
    assert not np.asarray(g.allowed[gr.DEAD]).any() and not bool(g.accepting[gr.DEAD])
    s = int(g.start)
    assert np.flatnonzero(np.asarray(g.allowed[s])).tolist() == [5]
    s = int(g.next_state[s, 5])
    assert np.flatnonzero(np.asarray(g.allowed[s])).tolist() == [6]
    s = int(g.next_state[s, 6])
    assert not np.asarray(g.allowed[s]).any() and bool(g.accepting[s])
    assert int(g.next_state[int(g.start), 7]) == gr.DEAD


def test_step_masks_shape_and_padding(grammar):
    tokens, mask = _pad([[10, 20, END], [14, END]], 5)
    masks = gr.step_masks(grammar, jnp.asarray(tokens), jnp.asarray(mask))
    assert masks.shape == (2, 5, V) and masks.dtype == jnp.bool_
    # Padding does not advance the FSM: the mask after the end stays that of the final state.
    np.testing.assert_array_equal(masks[1, 2], masks[1, 3])


@pytest.mark.parametrize("patterns, match", [
    ([[[50]]], "outside the vocabulary"), ([[gr.Repeat((1,), 1, 2, exclude=(1,))]], "allows no"),
    ([["x"]], "unsupported part"), ([], "at least one pattern")])
def test_compiler_rejects_bad_patterns(patterns, match):
    with pytest.raises(ValueError, match=match):
        gr.compile_grammar(patterns, V)


def test_make_grammar_validates():
    with pytest.raises(ValueError, match="next_state values"):
        gr.make_grammar(np.ones((2, 3), bool), np.full((2, 3), 5), 1, np.zeros(2, bool))
    with pytest.raises(ValueError, match="start state"):
        gr.make_grammar(np.ones((2, 3), bool), np.zeros((2, 3), int), 4, np.zeros(2, bool))
    with pytest.raises(ValueError, match="Repeat needs"):
        gr.Repeat(None, 3, 2)
