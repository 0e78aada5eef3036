"""The in-repo tiny tokenizer: a 512-token byte-level BPE with Llama-3 special tokens and chat.

Made by `scripts/make_tiny_tokenizer.py` (trained on a corpus the script writes; no download)
and committed under `jaxsocial/assets/tiny_tokenizer/`. Byte-level: any UTF-8 text encodes and
`decode(encode(text), skip_special_tokens=True) == text`. It fits `llama.preset("tiny")`
(vocab_size 512) and shares its ids: pad 0, bos `<|begin_of_text|>` 1, `<|end_of_text|>` 2,
`<|start_header_id|>` 3, `<|end_header_id|>` 4, `<|eot_id|>` 5 (the tokenizer's eos_token).
Padding side is left, as the model's forward expects.
"""

from __future__ import annotations

import os

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
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(tiny_tokenizer_path(), local_files_only=True)
