"""How topical the crowd's text choices are, per encoder (not a timing benchmark).

    python benchmarks/crowd_text_topics.py --model tiny --content_len 12     # the demo's encoder
    python benchmarks/crowd_text_topics.py --model smol --content_len 32     # SmolLM2-135M-Instruct

The encoder is the loop's (`train.epoch.pooled_states / project`): mean of the model's final
hidden states over a text's tokens, minus the mean over the post bank, times a fixed random
projection to d (seed 7919, as the loop with config.seed = 0), normalised; d = the full hidden
size means no projection. For the packaged corpus (`jaxsocial/assets/crowd_posts.json`) it
reports, per d:
- `centroid_acc`: share of bank posts whose nearest topic centroid (mean embedding of the
  topic's interest descriptions) is their own topic;
- `agree[T]`: crowd users drawn as in `society.reset` (a random description + interest_noise
  0.3), each choosing a post as the society does (Gumbel-max over cos / T): share of choices
  from the user's own topic, and the number of distinct posts chosen. Chance = 1 / #topics.
Last line: `model=... d=<smallest> centroid_acc=... agree_T0.05=...`.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsocial.models import checkpoint_hf, llama
from jaxsocial.social import text_bank


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("tiny", "smol"), default="tiny")
    ap.add_argument("--content_len", type=int, default=12)
    ap.add_argument("--dims", type=int, nargs="*", default=[16, 64, 0], help="0 = no projection")
    ap.add_argument("--users", type=int, default=4000)
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--examples", type=int, default=6, help="crowd choices to print (first d)")
    args = ap.parse_args()
    if args.model == "smol":
        from jaxsocial.models import zoo
        path = zoo.smollm2_135m_instruct()
        model = checkpoint_hf.from_pretrained(path, dtype="float32", param_dtype="float32")
        tok = checkpoint_hf.load_tokenizer(path)
    else:
        from jaxsocial.models.tokenizer import tiny_tokenizer
        tok = tiny_tokenizer()
        model = llama.Llama(llama.preset("tiny"), rngs=nnx.Rngs(0))
    graphdef, weights = nnx.split(model)

    @jax.jit
    def pooled(content):
        mask = content >= 0
        out = nnx.merge(graphdef, weights).forward(jnp.maximum(content, 0), mask)
        m = mask[..., None].astype(jnp.float32)
        return (out.hidden.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1.0)

    corpus = text_bank.load_corpus()
    posts = text_bank.tokenize(tok, corpus.posts, args.content_len)
    full = [len(tok.encode(" " + t, add_special_tokens=False)) for t in corpus.posts]
    print(f"posts: {len(corpus.posts)}, topics: {len(corpus.topics)}, tokens per post: mean "
          f"{np.mean(full):.1f}, truncated at L={args.content_len}: "
          f"{np.mean(np.asarray(full) > args.content_len):.0%}")
    t0 = time.perf_counter()
    h_post = text_bank.embed_rows(pooled, posts)
    h_desc = text_bank.embed_rows(pooled, text_bank.tokenize(tok, corpus.interests))
    print(f"encoder pass over {len(posts) + len(h_desc)} texts: {time.perf_counter() - t0:.1f} s")
    center = h_post.mean(0)
    post_topic, desc_topic = np.asarray(corpus.post_topic), np.asarray(corpus.interest_topic)
    nt, nd = len(corpus.topics), len(desc_topic)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    rng = np.random.default_rng(0)
    last = ""
    for d in args.dims:
        h = h_post.shape[1]
        proj = (np.eye(h, dtype=np.float32) if d == 0 else
                np.asarray(jax.random.normal(jax.random.key(7919), (h, d))) / np.sqrt(h))
        e_post, e_desc = unit((h_post - center) @ proj), unit((h_desc - center) @ proj)
        dd = e_post.shape[1]
        cent = unit(np.stack([e_desc[desc_topic == k].mean(0) for k in range(nt)]))
        acc = float((np.argmax(e_post @ cent.T, 1) == post_topic).mean())
        row = f"model={args.model} d={dd} centroid_acc={acc:.3f}"
        for temp in (0.05, 0.1):
            u = rng.integers(0, nd, args.users)
            interest = unit(e_desc[u] + args.noise * rng.standard_normal((args.users, dd))
                            / np.sqrt(dd))
            choice = np.argmax(interest @ e_post.T / temp
                               + rng.gumbel(size=(args.users, len(post_topic))), 1)
            agree = float((post_topic[choice] == desc_topic[u]).mean())
            row += f" agree_T{temp}={agree:.3f} distinct_T{temp}={len(np.unique(choice))}"
        print(row + f" chance={1 / nt:.3f}")
        if not last:  # a few choices at T = 0.05: the user's topic -> the post it drew
            for i in range(args.examples):
                u = int(rng.integers(0, nd))
                z = unit(e_desc[u] + args.noise * rng.standard_normal(dd) / np.sqrt(dd))
                j = int(np.argmax(e_post @ z / 0.05 + rng.gumbel(size=len(post_topic))))
                print(f"  {corpus.topics[desc_topic[u]]:>10} -> [{corpus.topics[post_topic[j]]}]"
                      f" {corpus.posts[j]}")
        last = last or row
    print(last)


if __name__ == "__main__":
    main()
