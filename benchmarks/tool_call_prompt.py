"""How often SmolLM2-135M-Instruct answers a tool_call prompt with a valid call, by prompt and
temperature: the measurement behind tool_call mode's one-example prompt and configs/smol.py's
`rollout.tool_call_temperature`.

    python benchmarks/tool_call_prompt.py                 # 32 answers per (prompt, temperature)
    python benchmarks/tool_call_prompt.py --answers=64 --temperatures 1.0 0.5

Prompts: "listing" is the tools listed as before the example call (`tool_instruction(...,
example=False)`) under the other modes' footer "Your action:"; "example" adds the one example
answer (`tool_instruction`'s default); "example_json" is what tool_call mode now sends: the
example and the footer `TOOL_FOOTER`. Each answers the four personas of configs/smol.py over one
fixed two-post feed, the actions of configs/smol.py, `--answers` samples (one batched call),
the same key for every cell; an answer is scored by `tool_calls.parse_tool_call_text` (the
reference of the rollout's parser). Printed and recorded per cell: the share of each failure
kind, the share of valid calls, and the share of valid posts whose text is the example's
(`EXAMPLE_POST`, copied). Not a timing: no peer.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import NO_RECORD_HELP, finish  # noqa: E402  benchmarks/: the result file

FEED = ("[1] user12: Just made fresh pasta with basil and tomatoes.\n"
        "[2] user40: Anyone watching the match tonight?")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=32)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7, 0.5, 0.3])
    ap.add_argument("--max_new_tokens", type=int, default=40)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    a = ap.parse_args()

    import importlib.util

    import jax

    from jaxsocial.agents import chat, tool_calls
    from jaxsocial.models import zoo
    from jaxsocial.train.config import FOOTER

    spec = importlib.util.spec_from_file_location("smol", os.path.join(ROOT, "configs",
                                                                         "smol.py"))
    smol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smol)
    actions = ("post", "like", "nothing")  # configs/smol.py's agents.actions
    feed_size = 2
    prompts = {
        "listing": (tool_calls.tool_instruction(actions, feed_size, example=False), FOOTER),
        "example": (tool_calls.tool_instruction(actions, feed_size), FOOTER),
        "example_json": (tool_calls.tool_instruction(actions, feed_size),
                         tool_calls.TOOL_FOOTER)}
    model = chat.ChatModel.load(zoo.smollm2_135m_instruct())
    personas = list(smol.PERSONAS)
    cells = []
    for name, (instruction, footer) in prompts.items():
        convs = [chat.messages(f"{instruction}\n{FEED}\n{footer}", system=personas[i % 4])
                 for i in range(a.answers)]
        for t in a.temperatures:
            out = model.complete(convs, jax.random.key(0), a.max_new_tokens, temperature=t)
            parsed = [tool_calls.parse_tool_call_text(x, actions, feed_size) for x in out.texts]
            kinds = collections.Counter(tool_calls.FAILURE_KINDS[p[0]] for p in parsed)
            posts = [p[3] for p in parsed if p[0] == tool_calls.FAIL_OK and p[1] == "post"]
            cell = {"prompt": name, "temperature": t, "answers": a.answers,
                    **{k: kinds.get(k, 0) / a.answers for k in tool_calls.FAILURE_KINDS},
                    "copied_example": (sum(x == tool_calls.EXAMPLE_POST for x in posts)
                                       / len(posts) if posts else 0.0)}
            cells.append(cell)
            print(f"prompt={name:<12s} temperature={t:.1f} ok={cell['ok']:.3f} "
                  f"no_json={cell['no_json']:.3f} unknown_action={cell['unknown_action']:.3f} "
                  f"bad_argument={cell['bad_argument']:.3f} "
                  f"copied_example={cell['copied_example']:.3f}", flush=True)
    finish("tool_call_prompt", {"model": "SmolLM2-135M-Instruct", "feed": FEED,
                                "actions": list(actions), "cells": cells},
           record=not a.no_record)


if __name__ == "__main__":
    main()
