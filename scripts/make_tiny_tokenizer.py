"""Regenerate jaxsocial/assets/tiny_tokenizer: a 512-token byte-level BPE with Llama-3 chat tokens.

    python scripts/make_tiny_tokenizer.py [--out jaxsocial/assets/tiny_tokenizer]

The corpus is written by this script (seeded templates of social-media posts, agent actions and
chat turns), so nothing is downloaded and the output is reproducible. The tokenizer follows
Llama 3's design at toy scale: Llama 3's pre-tokenizer regex, byte-level alphabet (any UTF-8
text encodes, and decodes back exactly), `<|begin_of_text|>` prepended by the post-processor,
and the Llama-3 chat template. Token ids 0..5 are the special tokens (see SPECIAL_TOKENS);
`llama.preset("tiny")` uses the same ids.
"""

from __future__ import annotations

import argparse
import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|pad|>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]
BOS, EOS, PAD = "<|begin_of_text|>", "<|eot_id|>", "<|pad|>"
# Llama 3's pre-tokenizer split (tiktoken's cl100k pattern).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Meta's Llama-3-Instruct chat template.
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")
MODEL_MAX_LENGTH = 1024

_ACTIONS = ["create_post", "like_post", "unlike_post", "dislike_post", "repost", "quote_post",
            "create_comment", "like_comment", "dislike_comment", "follow", "unfollow", "mute",
            "refresh", "search_posts", "search_user", "trend", "do_nothing"]
_TOPICS = ["music", "science", "football", "cooking", "the weather", "a new phone", "coffee",
           "the election", "climate change", "movies", "books", "travel", "our city", "history",
           "the market", "space", "dogs", "cats", "art", "games", "running", "the news"]
_OPINIONS = ["I love", "I really like", "I do not like", "Nobody talks about", "Thinking about",
             "Just read about", "Hot take on", "Can we talk about", "Excited for",
             "Not sure about", "Another day, more", "Learning about"]
_ENDINGS = ["!", ".", "?", "!!", " :)", " - what do you think?", ". Agree?", " #daily",
            " #news", ". Follow for more.", "...", " (thread)"]
_WORDS = ("the of and to a in is it you that he was for on are with as his they be at one have "
          "this from or had by word but what some we can out other were all there when up use "
          "your how said an each she which do their time if will way about many then them "
          "write would like so these her long make thing see him two has look more day could "
          "go come did number sound no most people my over know water than call first who may "
          "down side been now find any new work part take get place made live where after "
          "back little only round man year came show every good me give our under name very "
          "through just form sentence great think say help low line differ turn cause much "
          "mean before move right boy old too same tell does set three want air well also play "
          "small end put home read hand port large spell add even land here must big high such "
          "follow act why ask men change went light kind off need house picture try us again "
          "animal point mother world near build self earth father post like share reply user "
          "agent feed reward policy model society").split()
_SYSTEM = ["You are a user of a social media platform.",
           "You are agent {n}. Your bio: {bio}",
           "Choose one action from: {acts}.",
           "Reply with a JSON object with keys \"action\" and \"args\"."]
_BIOS = ["a teacher who likes {t}", "a student interested in {t}", "a writer posting about {t}",
         "retired, loves {t}", "engineer; opinions on {t} are my own"]


def _post(r: random.Random) -> str:
    return f"{r.choice(_OPINIONS)} {r.choice(_TOPICS)}{r.choice(_ENDINGS)}"


def _sentence(r: random.Random) -> str:
    words = [r.choice(_WORDS) for _ in range(r.randint(4, 14))]
    s = " ".join(words)
    return s[0].upper() + s[1:] + r.choice([".", ".", "?", "!", ","])


def _action(r: random.Random) -> str:
    act = r.choice(_ACTIONS)
    if act in ("create_post", "create_comment", "quote_post"):
        args = {"content": _post(r)}
        if act != "create_post":
            args["post_id"] = r.randint(0, 9999)
    elif act in ("follow", "unfollow", "mute", "search_user"):
        args = {"user_id": r.randint(0, 999)}
    elif act == "search_posts":
        args = {"query": r.choice(_TOPICS)}
    elif act in ("refresh", "trend", "do_nothing"):
        args = {}
    else:
        args = {"post_id": r.randint(0, 9999)}
    return json.dumps({"action": act, "args": args})


def _feed(r: random.Random) -> str:
    lines = []
    for _ in range(r.randint(1, 4)):
        lines.append(f"post_id: {r.randint(0, 9999)} | user_id: {r.randint(0, 999)} | "
                     f"likes: {r.randint(0, 250)} | dislikes: {r.randint(0, 40)}\n"
                     f"content: {_post(r)}")
    return "Here is your feed:\n" + "\n".join(lines) + "\nWhat do you do next?"


def _chat(r: random.Random) -> str:
    topic = r.choice(_TOPICS)
    system = r.choice(_SYSTEM).format(n=r.randint(0, 999), bio=r.choice(_BIOS).format(t=topic),
                                      acts=", ".join(r.sample(_ACTIONS, 5)))
    turns = [("system", system), ("user", _feed(r)), ("assistant", _action(r))]
    return "".join(f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>"
                   for role, text in turns)


def corpus(seed: int = 0, n: int = 4000) -> list:
    """The training text: `n` seeded documents mixing posts, prose, actions, feeds and chats."""
    r = random.Random(seed)
    makers = [_post, _sentence, _action, _feed, _chat]
    docs = []
    for _ in range(n):
        docs.append(" ".join(r.choice(makers)(r) for _ in range(r.randint(1, 3))))
    # Digits, punctuation and a little non-ASCII so common bytes get merged sensibly.
    docs += [" ".join(str(r.randint(0, 10 ** r.randint(1, 6))) for _ in range(20))
             for _ in range(50)]
    docs += ["Café, naïve, über, 東京, 你好, Привет, ¿qué? — “quotes” … 🙂"] * 5
    return docs


def build(seed: int = 0) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2,
                                  special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1",
                                      special_tokens=[(BOS, bos_id)]),
    ])
    return tok


def write(out: str, seed: int = 0) -> None:
    tok = build(seed)
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"), pretty=True)
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "left",
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2)
        f.write("\n")
    print(f"wrote {out}: vocab {tok.get_vocab_size()}, special ids "
          f"{[tok.token_to_id(s) for s in SPECIAL_TOKENS]}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "jaxsocial", "assets", "tiny_tokenizer")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.normpath(default))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out, args.seed)


if __name__ == "__main__":
    main()
