"""tool_call mode: the answer is an OASIS-style function call in JSON,
    {"name": "like_post", "arguments": {"post_id": 3}}
parsed leniently on the device (whitespace, key order, ' or " quotes, text before the first
"{" and after the object's closing "}"; "parameters" is accepted for "arguments", Llama-3's
key). Numbers name the feed's labels, as in the other modes: post_id / followee_id / mutee_id
= [n] (the post, or that post's author), comment_id = a comment's label.

Here: the prompt's list of tools (`tool_instruction`) and the room check (`shortest_tool_calls`,
`check_tool_call_room`), each token's bytes (`token_bytes`: [V, max_bytes]) and `ToolVocab`,
the JAX parser `parse_tool_call` (tokens [B, N] -> `Parsed` and a failure kind [B]; one
`lax.scan` of `_scan_json` over the characters [B, N * Lt]) and its host-side reference on
text, `parse_tool_call_text` (through `json`). The tools' names and arguments (`TOOL_ARGS`)
and the action table live in `actions`.
"""

from __future__ import annotations

import re
from typing import Dict, Sequence, Tuple, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsocial.agents.actions import ACTIONS, TOOL_ARGS, Parsed, _check_comments, resolve
from jaxsocial.social.actions import ActionType
from jaxsocial.social.state import PAD_TOKEN

Array = jax.Array


# Failure kinds (`parse_tool_call`'s second output; 0 = parsed).
FAIL_OK, FAIL_NO_JSON, FAIL_UNKNOWN_ACTION, FAIL_BAD_ARGUMENT = 0, 1, 2, 3
FAILURE_KINDS = ("ok", "no_json", "unknown_action", "bad_argument")

INT_ARGS = ("post_id", "followee_id", "mutee_id", "comment_id")
TEXT_ARGS = ("content", "quote_content", "query")
ARGS_KEYS = ("arguments", "parameters")
KEYS = ("name",) + ARGS_KEYS + INT_ARGS + TEXT_ARGS   # the keys the parser tracks
_ARG_HELP = {
    "post_id": "the number [n] of a post in your feed",
    "followee_id": "the number [n] of a post in your feed; you follow its author",
    "mutee_id": "the number [n] of a post in your feed; you mute its author",
    "comment_id": "the number [n] of a comment in your feed",
    "content": "your text", "quote_content": "your text", "query": "what to search for",
}
_INT_MAX = 10 ** 7  # integer arguments are clamped here (any label is far below)


EXAMPLE_POST = "Good morning, everyone!"  # the example call's text: no topic of any crowd
TOOL_FOOTER = "Your tool call (JSON):"  # tool_call mode's footer (agents.tool_footer)


def example_call(actions: Union[str, Sequence[str]]) -> str:
    """The one example answer `tool_instruction` shows: a create_post call with
    `EXAMPLE_POST` when posting is a tool, else the first tool's call with label 1 (and
    `EXAMPLE_POST` as any text argument), written as a model would answer."""
    import json
    kws = resolve(actions)
    kw = "post" if "post" in kws else kws[0]
    name, iarg, targ = TOOL_ARGS[kw]
    args = {**({iarg: 1} if iarg else {}), **({targ: EXAMPLE_POST} if targ else {})}
    return json.dumps({"name": name, **({"arguments": args} if args else {})})


def tool_instruction(actions: Union[str, Sequence[str]], feed_size: int,
                     intro: str = "You are on a social network. Your feed is below.",
                     example: bool = True) -> str:
    """The prompt's instruction in tool_call mode: the answer format, one line per tool of
    `actions` (`resolve`) with its arguments, e.g. `- like_post(post_id: int): ...`, and (with
    `example`) one whole example answer (`example_call`) on its last line. A one-example prompt
    is what lets a small model answer in JSON at all: docs/society.md, "Tool calls"."""
    lines = [intro.strip(), "Answer with exactly one tool call in JSON, for example "
             '{"name": "like_post", "arguments": {"post_id": 1}}. Tools:']
    for kw in resolve(actions):
        name, iarg, targ = TOOL_ARGS[kw]
        args = [f"{a}: {'int' if a == iarg else 'string'}" for a in (iarg, targ) if a]
        helps = "; ".join(f"{a} = {_ARG_HELP[a]}" for a in (iarg, targ) if a)
        lines.append(f"- {name}({', '.join(args)})" + (f": {helps}" if helps else ""))
    lines.append(f"Posts are numbered [1] to [{feed_size}].")
    if example:
        lines += ["Example answer:", example_call(actions)]
    return "\n".join(lines)


def shortest_tool_calls(actions: Union[str, Sequence[str]], feed_size: int) -> Dict[str, str]:
    """Per configured tool (`resolve(actions)` keyword -> text): the shortest answer
    `parse_tool_call` accepts for it, e.g. '{"name":"do_nothing"}' or
    '{"name":"like_post","arguments":{"post_id":1}}': no whitespace, the smallest valid label
    (a shown comment's labels start after the feed's posts), a one-character text."""
    out = {}
    for kw in resolve(actions):
        name, iarg, targ = TOOL_ARGS[kw]
        args = []
        if iarg:
            args.append(f'"{iarg}":{feed_size + 1 if ACTIONS[kw].target == "comment" else 1}')
        if targ:
            args.append(f'"{targ}":"x"')
        arguments = ',"arguments":{' + ",".join(args) + "}" if args else ""
        out[kw] = '{"name":"' + name + '"' + arguments + "}"
    return out


def check_tool_call_room(tokenizer, actions: Union[str, Sequence[str]], feed_size: int,
                         max_new_tokens: int) -> None:
    """ValueError naming `rollout.max_new_tokens` when the shortest valid call of some
    configured tool (`shortest_tool_calls`, counted with the run's tokenizer) does not fit in
    it: that tool could never be used, and below the smallest count every answer fails to
    parse. The tool_call counterpart of the constrained grammar's room check."""
    calls = shortest_tool_calls(actions, feed_size)
    tokens = {kw: len(tokenizer.encode(text, add_special_tokens=False))
              for kw, text in calls.items()}
    kw = max(tokens, key=tokens.get)
    if max_new_tokens < tokens[kw]:
        raise ValueError(
            f"rollout.max_new_tokens={max_new_tokens} is too few for agents.action_mode="
            f"'tool_call': the shortest valid {kw!r} call, {calls[kw]}, takes {tokens[kw]} "
            f"tokens (set rollout.max_new_tokens >= {tokens[kw]}; below "
            f"{min(tokens.values())} no answer can parse)")


def token_bytes(tokenizer, vocab_size: int, max_bytes: int = 16) -> Tuple[np.ndarray, np.ndarray]:
    """Each token's bytes: chars [V, max_bytes] uint8, length [V] int32 (special and unused ids:
    0; a longer token keeps its first max_bytes). Byte-level BPE ("Ġ"), SentencePiece ("▁",
    "<0x0A>") and, otherwise, `decode([id])`."""
    n = min(len(tokenizer), vocab_size)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    special |= set(getattr(tokenizer, "all_special_ids", []) or [])
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte map

    inv = {c: b for b, c in bytes_to_unicode().items()}
    plain = [p for i, p in enumerate(pieces) if i not in special and p]
    byte_level = all(ch in inv for p in plain[:2000] for ch in p)
    sp = not byte_level and any("▁" in p for p in plain[:5000])
    chars = np.zeros((vocab_size, max_bytes), np.uint8)
    length = np.zeros((vocab_size,), np.int32)
    for i, p in enumerate(pieces):
        if i in special or p is None:
            continue
        if byte_level:
            b = bytes(inv[ch] for ch in p)
        elif sp and len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            b = bytes([int(p[3:5], 16)])
        elif sp:
            b = p.replace("▁", " ").encode("utf-8")
        else:
            b = tokenizer.decode([i]).encode("utf-8")
        b = b[:max_bytes]
        chars[i, :len(b)] = np.frombuffer(b, np.uint8)
        length[i] = len(b)
    return chars, length


def _table(strings: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    width = max(len(s) for s in strings) + 1
    out = np.full((len(strings), width), -1, np.int32)
    for i, s in enumerate(strings):
        out[i, :len(s)] = [ord(ch) for ch in s]
    return out, np.asarray([len(s) for s in strings], np.int32)


@struct.dataclass
class ToolVocab:
    """What `parse_tool_call` needs: per token its bytes (`token_bytes`), the tracked keys and the
    configured tools as character tables, and per tool its society action, which integer /
    text argument it takes (index into INT_ARGS / TEXT_ARGS, -1 = none) and its label range."""

    tok_chars: Array     # [V, Lt] uint8
    tok_len: Array       # [V] int32
    key_chars: Array     # [NK, Lk] int32 (-1 padded)
    key_len: Array       # [NK]
    name_chars: Array    # [M, Ln] int32 (-1 padded)
    name_len: Array      # [M]
    action_type: Array   # [M] int32
    int_arg: Array       # [M] int32
    text_arg: Array      # [M] int32
    lo: Array            # [M] int32 smallest valid label (1-based), for tools with an int arg
    hi: Array            # [M] int32 largest valid label
    to_author: Array     # [M] bool
    to_comment: Array    # [M] bool
    names: Tuple[str, ...] = struct.field(pytree_node=False, default=())

    @staticmethod
    def build(tokenizer, actions: Union[str, Sequence[str]], feed_size: int, vocab_size: int,
              feed_comments: int = 0, max_token_bytes: int = 16) -> "ToolVocab":
        actions = resolve(actions)
        _check_comments(actions, feed_comments)
        chars, length = token_bytes(tokenizer, vocab_size, max_token_bytes)
        keys, key_len = _table(KEYS)
        names = tuple(TOOL_ARGS[a][0] for a in actions)
        name_chars, name_len = _table(names)
        iarg = [INT_ARGS.index(TOOL_ARGS[a][1]) if TOOL_ARGS[a][1] else -1 for a in actions]
        targ = [TEXT_ARGS.index(TOOL_ARGS[a][2]) if TOOL_ARGS[a][2] else -1 for a in actions]
        comment = [ACTIONS[a].target == "comment" for a in actions]
        lo = [feed_size + 1 if c else 1 for c in comment]
        hi = [feed_size + feed_size * feed_comments if c else feed_size for c in comment]
        j = jnp.asarray
        return ToolVocab(tok_chars=j(chars), tok_len=j(length),
                         key_chars=j(keys), key_len=j(key_len), name_chars=j(name_chars),
                         name_len=j(name_len),
                         action_type=j([int(ACTIONS[a].type) for a in actions], jnp.int32),
                         int_arg=j(iarg, jnp.int32), text_arg=j(targ, jnp.int32),
                         lo=j(lo, jnp.int32), hi=j(hi, jnp.int32),
                         to_author=j([ACTIONS[a].target == "author" for a in actions]),
                         to_comment=j(comment), names=names)


# Parser states. ctx: where the current container's grammar is.
_O_FIRST, _O_KEY, _O_COLON, _O_VAL, _O_NEXT, _A_FIRST, _A_VAL, _A_NEXT = range(8)
_L_NONE, _L_STR, _L_NUM, _L_LIT = range(4)                   # lexer: inside what
_SEEK, _PARSE, _DONE, _ERROR = range(4)                       # phase
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)  # JSON number
_V_STR, _V_NUM, _V_LIT, _V_OBJ, _V_ARR = range(5)             # value kinds
_MAX_DEPTH = 30
_LITERALS = ("true", "false", "null")
_K_NAME, _K_INT0, _K_TXT0 = 0, 1 + len(ARGS_KEYS), 1 + len(ARGS_KEYS) + len(INT_ARGS)


def _scan_json(tv: ToolVocab, chars: Array, valid: Array) -> Dict[str, Array]:
    """One pass over the characters chars [B, S] (valid [B, S]): a JSON validator for the object
    that starts at the first "{" (a container stack of depth <= 30), which records on the way the
    top level's "name" (matched against the tools) and "arguments" (its integer and text
    arguments: value, or the character span of a string). Returns the final state."""
    b, s = chars.shape
    nk, nm = tv.key_chars.shape[0], tv.name_chars.shape[0]
    ni, nt = len(INT_ARGS), len(TEXT_ARGS)
    lit_chars, lit_len = (jnp.asarray(x) for x in _table(_LITERALS))
    zi = jnp.zeros((b,), jnp.int32)
    zb = jnp.zeros((b,), bool)
    init = dict(phase=zi, depth=zi, arrbits=zi, ctx=zi, lex=zi, q=zi, esc=zi, skey=zb, spos=zi,
                sstart=zi, sdval=zi, sdig=zb, kmask=jnp.zeros((b, nk), bool),
                nmask=jnp.zeros((b, nm), bool), nst=zi, nval=zi, nint=zb, nneg=zb, lid=zi,
                lpos=zi, key1=zi - 1, key2=zi - 1, in_args=zb, name_id=zi - 1, args_state=zi,
                istat=jnp.zeros((b, ni), jnp.int32), ival=jnp.zeros((b, ni), jnp.int32),
                tstat=jnp.zeros((b, nt), jnp.int32), tstart=jnp.zeros((b, nt), jnp.int32),
                tend=jnp.zeros((b, nt), jnp.int32))

    def put(st, cond, **new):
        out = dict(st)
        for k, v in new.items():
            old = st[k]
            cnd = cond if old.ndim == 1 else cond[:, None]
            out[k] = jnp.where(cnd, jnp.broadcast_to(v, old.shape).astype(old.dtype), old)
        return out

    def after_value(st):
        return jnp.where((st["arrbits"] >> st["depth"]) & 1 == 1, _A_NEXT, _O_NEXT)

    def complete(st, cond, vtype, pos):
        """A value of kind vtype ended inside the container at st["depth"]."""
        vtype = jnp.broadcast_to(jnp.asarray(vtype, jnp.int32), cond.shape)
        str_v = vtype == _V_STR
        d1 = cond & (st["depth"] == 1)
        name_hit = st["nmask"] & (tv.name_len[None, :] == st["spos"][:, None])
        name_new = jnp.where(str_v & name_hit.any(1), jnp.argmax(name_hit, 1), -1)
        st = put(st, d1 & (st["key1"] == _K_NAME), name_id=name_new)
        is_args = d1 & (st["key1"] >= 1) & (st["key1"] < _K_INT0)
        st = put(st, is_args, args_state=jnp.where(vtype == _V_OBJ, 1, 2))
        d2 = cond & (st["depth"] == 2) & st["in_args"]
        num_ok = st["nint"]
        num_v = jnp.where(st["nneg"], -st["nval"], st["nval"])
        str_ok = st["sdig"] & (st["spos"] >= 1) & (st["spos"] <= 6)
        ok = jnp.where(str_v, str_ok, (vtype == _V_NUM) & num_ok)
        v = jnp.where(str_v, st["sdval"], num_v)
        oh_i = (jnp.arange(ni)[None] == (st["key2"] - _K_INT0)[:, None]) & d2[:, None]
        out = dict(st)
        out["istat"] = jnp.where(oh_i, jnp.where(ok, 1, 2)[:, None], st["istat"])
        out["ival"] = jnp.where(oh_i, v[:, None], st["ival"])
        oh_t = (jnp.arange(nt)[None] == (st["key2"] - _K_TXT0)[:, None]) & d2[:, None]
        out["tstat"] = jnp.where(oh_t, jnp.where(str_v, 1, 2)[:, None], st["tstat"])
        out["tstart"] = jnp.where(oh_t, st["sstart"][:, None], st["tstart"])
        out["tend"] = jnp.where(oh_t, pos, st["tend"])
        return put(out, cond, ctx=after_value(out))

    def step(st, xs):
        c, ok_c, pos = xs
        c = c.astype(jnp.int32)
        ws = (c == 32) | (c == 9) | (c == 10) | (c == 13)
        dig = (c >= 48) & (c <= 57)
        d = c - 48
        seek = ok_c & (st["phase"] == _SEEK) & (c == ord("{"))
        # A. inside a number (it ends at the first character that cannot continue it, which
        # is then read as structure) or a literal (true / false / null)
        act = ok_c & (st["phase"] == _PARSE)
        in_num = act & (st["lex"] == _L_NUM)
        ns = st["nst"]
        is_e = (c == ord("e")) | (c == ord("E"))
        dot = c == ord(".")
        nxt = jnp.full_like(c, -1)
        nxt = jnp.where((ns == _N_MINUS) & dig, jnp.where(d == 0, _N_ZERO, _N_INT), nxt)
        nxt = jnp.where(((ns == _N_INT) | (ns == _N_ZERO)) & dot, _N_DOT, nxt)
        nxt = jnp.where(((ns == _N_INT) | (ns == _N_ZERO) | (ns == _N_FRAC)) & is_e, _N_E, nxt)
        nxt = jnp.where((ns == _N_INT) & dig, _N_INT, nxt)
        nxt = jnp.where(((ns == _N_DOT) | (ns == _N_FRAC)) & dig, _N_FRAC, nxt)
        nxt = jnp.where((ns == _N_E) & ((c == ord("+")) | (c == ord("-"))), _N_ESIGN, nxt)
        nxt = jnp.where(((ns == _N_E) | (ns == _N_ESIGN) | (ns == _N_EXP)) & dig, _N_EXP, nxt)
        cont = in_num & (nxt >= 0)
        accepting = (ns == _N_ZERO) | (ns == _N_INT) | (ns == _N_FRAC) | (ns == _N_EXP)
        st = put(st, cont, nst=nxt, nint=st["nint"] & (nxt != _N_DOT) & (nxt != _N_E),
                 nval=jnp.where(nxt == _N_INT, jnp.minimum(st["nval"] * 10 + d, _INT_MAX),
                                st["nval"]))
        ndone = in_num & (nxt < 0) & accepting
        st = put(st, in_num & (nxt < 0) & ~accepting, phase=_ERROR)
        st = put(st, ndone, lex=_L_NONE)
        st = complete(st, ndone, _V_NUM, pos)
        in_lit = act & (st["lex"] == _L_LIT)
        lit_ok = c == lit_chars[st["lid"], jnp.minimum(st["lpos"], lit_chars.shape[1] - 1)]
        ldone = in_lit & lit_ok & (st["lpos"] + 1 == lit_len[st["lid"]])
        st = put(st, in_lit & ~lit_ok, phase=_ERROR)
        st = put(st, in_lit, lpos=st["lpos"] + 1)
        st = put(st, ldone, lex=_L_NONE)
        st = complete(st, ldone, _V_LIT, pos)
        used = cont | in_lit
        # B. inside a string (keys and values; ' or " quoted)
        in_str = act & (st["lex"] == _L_STR) & (st["phase"] == _PARSE)
        esc = st["esc"]
        close = in_str & (esc == 0) & (c == st["q"])
        bslash = in_str & (esc == 0) & (c == 92)
        esc_ok = ((c == 34) | (c == 92) | (c == 47) | (c == ord("b")) | (c == ord("f"))
                  | (c == ord("n")) | (c == ord("r")) | (c == ord("t")) | (c == ord("u"))
                  | ((c == 39) & (st["q"] == 39)))
        hexd = dig | ((c >= 97) & (c <= 102)) | ((c >= 65) & (c <= 70))
        bad = in_str & (((esc == 5) & ~esc_ok) | ((esc >= 1) & (esc <= 4) & ~hexd))
        new_esc = jnp.where(bslash, 5, jnp.where(esc == 5, jnp.where(c == ord("u"), 4, 0),
                                                 jnp.maximum(esc - 1, 0)))
        char = in_str & ~close
        p = st["spos"]
        kc = tv.key_chars[:, jnp.minimum(p, tv.key_chars.shape[1] - 1)].T   # [B, NK]
        nc = tv.name_chars[:, jnp.minimum(p, tv.name_chars.shape[1] - 1)].T  # [B, M]
        st = put(st, char, esc=new_esc, spos=p + 1,
                 kmask=st["kmask"] & (kc == c[:, None]) & (p < tv.key_chars.shape[1])[:, None],
                 nmask=st["nmask"] & (nc == c[:, None]) & (p < tv.name_chars.shape[1])[:, None],
                 sdig=st["sdig"] & dig, sdval=jnp.minimum(st["sdval"] * 10 + d, _INT_MAX))
        st = put(st, bad, phase=_ERROR)
        st = put(st, close, lex=_L_NONE)
        key_hit = st["kmask"] & (tv.key_len[None, :] == st["spos"][:, None])
        key = jnp.where(key_hit.any(1), jnp.argmax(key_hit, 1), -1)
        kclose = close & st["skey"]
        st = put(st, kclose & (st["depth"] == 1), key1=key)
        st = put(st, kclose & (st["depth"] == 2), key2=key)
        st = put(st, kclose, ctx=_O_COLON)
        st = complete(st, close & ~st["skey"], _V_STR, pos)
        used = used | in_str
        # C. structure
        sc = ok_c & (st["phase"] == _PARSE) & ~used & (st["lex"] == _L_NONE) & ~ws
        ctx = st["ctx"]
        quote = (c == 34) | (c == 39)
        want_val = (ctx == _O_VAL) | (ctx == _A_VAL) | (ctx == _A_FIRST)
        key_start = sc & ((ctx == _O_FIRST) | (ctx == _O_KEY)) & quote
        val_str = sc & want_val & quote
        open_o = sc & want_val & (c == ord("{"))
        open_a = sc & want_val & (c == ord("["))
        num0 = sc & want_val & (dig | (c == ord("-")))
        lit_id = jnp.where(c == ord("t"), 0, jnp.where(c == ord("f"), 1, 2))
        lit0 = sc & want_val & ((c == ord("t")) | (c == ord("f")) | (c == ord("n")))
        close_o = sc & ((ctx == _O_FIRST) | (ctx == _O_NEXT)) & (c == ord("}"))
        close_a = sc & ((ctx == _A_FIRST) | (ctx == _A_NEXT)) & (c == ord("]"))
        colon = sc & (ctx == _O_COLON) & (c == ord(":"))
        comma_o = sc & (ctx == _O_NEXT) & (c == ord(","))
        comma_a = sc & (ctx == _A_NEXT) & (c == ord(","))
        handled = (key_start | val_str | open_o | open_a | num0 | lit0 | close_o | close_a
                   | colon | comma_o | comma_a)
        st = put(st, sc & ~handled, phase=_ERROR)
        s_any = key_start | val_str
        st = put(st, s_any, lex=_L_STR, q=c, esc=0, skey=key_start, spos=0, sstart=pos + 1,
                 sdval=0, sdig=True, kmask=True, nmask=True)
        st = put(st, num0, lex=_L_NUM, nval=jnp.where(dig, d, 0), nint=True,
                 nneg=c == ord("-"),
                 nst=jnp.where(c == ord("-"), _N_MINUS, jnp.where(d == 0, _N_ZERO, _N_INT)))
        st = put(st, lit0, lex=_L_LIT, lid=lit_id, lpos=1)
        st = put(st, colon, ctx=_O_VAL)
        st = put(st, comma_o, ctx=_O_KEY)
        st = put(st, comma_a, ctx=_A_VAL)
        opened = open_o | open_a
        newd = st["depth"] + 1
        args_obj = open_o & (st["depth"] == 1) & (st["key1"] >= 1) & (st["key1"] < _K_INT0)
        st = put(st, opened & (st["depth"] == 1), in_args=args_obj)
        st = put(st, args_obj, istat=0, tstat=0)
        st = put(st, opened & (newd > _MAX_DEPTH), phase=_ERROR)
        bit = jnp.left_shift(1, jnp.minimum(newd, _MAX_DEPTH))
        st = put(st, opened, depth=newd, ctx=jnp.where(open_a, _A_FIRST, _O_FIRST),
                 arrbits=jnp.where(open_a, st["arrbits"] | bit, st["arrbits"] & ~bit))
        st = put(st, opened & (newd == 2), key2=-1)
        closed = close_o | close_a
        st = put(st, closed, depth=st["depth"] - 1)
        st = put(st, closed & (st["depth"] == 0), phase=_DONE)
        st = complete(st, closed & (st["depth"] > 0), jnp.where(close_a, _V_ARR, _V_OBJ), pos)
        # the first "{" opens the object
        st = put(st, seek, phase=_PARSE, depth=1, arrbits=0, ctx=_O_FIRST, lex=_L_NONE)
        return st, None

    xs = (chars.T, valid.T, jnp.arange(s, dtype=jnp.int32))
    final, _ = jax.lax.scan(step, init, xs)
    return final


def parse_tool_call(tv: ToolVocab, tokens: Array, mask: Array,
                    content_len: int) -> Tuple[Parsed, Array]:
    """tokens [B, N] int32, mask [B, N] bool (response incl. stop) -> (Parsed, failure [B]
    int32: FAIL_OK, or FAIL_NO_JSON (no "{", or the object from the first "{" is not JSON:
    syntax error, unclosed), FAIL_UNKNOWN_ACTION ("name" missing, not a string or not a
    configured tool), FAIL_BAD_ARGUMENT ("arguments" not an object, a needed argument missing,
    of the wrong type (an integer, or a string of 1-6 digits; a string for text), a number that
    is not a shown label, or text with no whole token)).

    Lenient: JSON whitespace, any key order, ' or " quotes (\\' escapes in '...'), text before
    the first "{" and after its object, unknown keys and arguments (ignored), "parameters" for
    "arguments"; duplicate keys: the last wins (as json.loads). Strict JSON otherwise (no
    trailing commas, no bare words, numbers as JSON spells them). Keys and names are compared
    as written (one spelled with an escape does not match). The content is the response's
    tokens that lie inside the string's quotes (a token may start with the opening quote; one
    that runs past the closing quote is left out), at most content_len of them."""
    chex.assert_rank(tokens, 2)
    b, n = tokens.shape
    lt = tv.tok_chars.shape[1]
    safe = jnp.clip(tokens, 0, tv.tok_chars.shape[0] - 1)
    tlen = jnp.where(mask & (tokens >= 0), tv.tok_len[safe], 0)           # [B, N]
    chars = tv.tok_chars[safe].reshape(b, n * lt)
    valid = (jnp.arange(lt)[None, None, :] < tlen[:, :, None]).reshape(b, n * lt)
    st = _scan_json(tv, chars, valid)
    rows = jnp.arange(b)
    tool = jnp.maximum(st["name_id"], 0)
    ia, ta = tv.int_arg[tool], tv.text_arg[tool]
    st_i = st["istat"][rows, jnp.maximum(ia, 0)]
    val = st["ival"][rows, jnp.maximum(ia, 0)]
    int_ok = (st_i == 1) & (val >= tv.lo[tool]) & (val <= tv.hi[tool])
    start = st["tstart"][rows, jnp.maximum(ta, 0)]
    end = st["tend"][rows, jnp.maximum(ta, 0)]
    t0 = jnp.arange(n)[None, :] * lt
    t1 = t0 + tlen
    inside = ((tlen > 0) & (t0 >= start[:, None] - 1) & (t1 <= end[:, None])
              & (t1 > start[:, None]))
    n_in = inside.sum(1)
    first = jnp.argmax(inside, axis=1)
    idx = first[:, None] + jnp.arange(content_len)[None, :]
    gathered = jnp.take_along_axis(tokens, jnp.minimum(idx, n - 1), axis=1)
    txt_ok = (st["tstat"][rows, jnp.maximum(ta, 0)] == 1) & (n_in > 0)
    bad_arg = ((st["args_state"] == 2) | ((ia >= 0) & ~int_ok) | ((ta >= 0) & ~txt_ok))
    fail = jnp.where(st["phase"] != _DONE, FAIL_NO_JSON,
                     jnp.where(st["name_id"] < 0, FAIL_UNKNOWN_ACTION,
                               jnp.where(bad_arg, FAIL_BAD_ARGUMENT, FAIL_OK)))
    ok = fail == FAIL_OK
    keep = ok[:, None] & (ta >= 0)[:, None] & (jnp.arange(content_len)[None, :] < n_in[:, None])
    parsed = Parsed(
        type=jnp.where(ok, tv.action_type[tool], int(ActionType.MALFORMED)).astype(jnp.int32),
        feed_pos=jnp.where(ok & (ia >= 0), val - 1, -1).astype(jnp.int32),
        content=jnp.where(keep, gathered, PAD_TOKEN).astype(jnp.int32), parsed=ok,
        to_author=tv.to_author[tool] & ok, to_comment=tv.to_comment[tool] & ok)
    return parsed, fail.astype(jnp.int32)


def _double_quoted(text: str) -> str:
    """text with its '...' strings rewritten as "..." (outside strings nothing changes)."""
    out, i, q = [], 0, None
    while i < len(text):
        ch = text[i]
        if q is None:
            if ch in "\"'":
                q = ch
                out.append('"')
            else:
                out.append(ch)
        elif ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append("'" if (q == "'" and nxt == "'") else ch + nxt)
            i += 1
        elif ch == q:
            q = None
            out.append('"')
        else:
            out.append('\\"' if (ch == '"' and q == "'") else ch)
        i += 1
    return "".join(out)


def parse_tool_call_text(text: str, actions: Union[str, Sequence[str]], feed_size: int,
                         feed_comments: int = 0):
    """The host-side reference of `parse_tool_call`, on text, through `json`: -> (failure kind,
    keyword or None, label (1-based) or None, text or None). The object is the one
    `json.JSONDecoder.raw_decode` reads at the first "{" after '...' strings are rewritten as
    "..." (control characters allowed in strings, NaN / Infinity refused)."""
    import json

    def refuse(name):
        raise ValueError(name)

    i = text.find("{")
    if i < 0:
        return FAIL_NO_JSON, None, None, None
    try:
        obj, _ = json.JSONDecoder(strict=False, parse_constant=refuse).raw_decode(
            _double_quoted(text[i:]))
    except (ValueError, RecursionError):
        return FAIL_NO_JSON, None, None, None
    if not isinstance(obj, dict):
        return FAIL_NO_JSON, None, None, None
    by_name = {TOOL_ARGS[a][0]: a for a in resolve(actions)}
    name = obj.get("name")
    if not isinstance(name, str) or name not in by_name:
        return FAIL_UNKNOWN_ACTION, None, None, None
    kw = by_name[name]
    _, iarg, targ = TOOL_ARGS[kw]
    args = {}
    for k, v in obj.items():  # the last of "arguments" / "parameters" wins
        if k in ARGS_KEYS:
            args = v
    bad = (FAIL_BAD_ARGUMENT, kw, None, None)
    if not isinstance(args, dict):
        return bad
    label = content = None
    if iarg:
        v = args.get(iarg)
        if isinstance(v, str) and re.fullmatch("[0-9]{1,6}", v):
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            return bad
        comment = ACTIONS[kw].target == "comment"
        lo, hi = ((feed_size + 1, feed_size * (1 + feed_comments)) if comment
                  else (1, feed_size))
        if not lo <= v <= hi:
            return bad
        label = v
    if targ:
        content = args.get(targ)
        if not isinstance(content, str) or not content:
            return bad
    return FAIL_OK, kw, label, content
