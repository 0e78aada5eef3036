"""The committed tiny tokenizer: byte-level round trips, special ids, Llama-3 chat format."""

import json
import os

import pytest
from transformers import PreTrainedTokenizerFast

from jaxsocial.models import llama
from jaxsocial.models import tokenizer as tk


@pytest.fixture(scope="module")
def tok():
    return tk.tiny_tokenizer()


TEXTS = [
    "Hello world! I love music.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\n\nlines\r\n",
    '{"action": "like_post", "args": {"post_id": 42}}',
    "Café naïve über — “quotes” … ¿qué?",
    "東京 你好 Привет 🙂🚀 \u200b zero-width",
    "bytes \x00\x01\x7f ok",
    "",
]


def test_fits_tiny_preset_and_ids_agree(tok):
    cfg = llama.preset("tiny")
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len(tok) <= cfg.vocab_size == 512
    assert tok.bos_token == "<|begin_of_text|>" and tok.bos_token_id == cfg.bos_token_id
    assert tok.pad_token_id == cfg.pad_token_id == tk.PAD_ID
    assert tok.eos_token == "<|eot_id|>" and tok.eos_token_id in cfg.eos_token_ids
    ids = tok.convert_tokens_to_ids(["<|pad|>", "<|begin_of_text|>", "<|end_of_text|>",
                                     "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    assert ids == [tk.PAD_ID, tk.BOS_ID, tk.END_OF_TEXT_ID, tk.START_HEADER_ID,
                   tk.END_HEADER_ID, tk.EOT_ID]
    assert set(cfg.eos_token_ids) == {tk.END_OF_TEXT_ID, tk.EOT_ID}
    assert llama.preset("small_20m").eos_token_ids == cfg.eos_token_ids
    assert tok.padding_side == "left"


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_round_trip(tok, text):
    ids = tok(text).input_ids
    assert ids[0] == tk.BOS_ID and all(0 <= i < 512 for i in ids)
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids) == "<|begin_of_text|>" + text
    plain = tok(text, add_special_tokens=False).input_ids
    assert plain == ids[1:]
    # BPE merges do compress: fewer tokens than UTF-8 bytes on ordinary text.
    if text.startswith("Hello"):
        assert len(plain) < 0.75 * len(text.encode())


def test_special_token_strings_are_single_tokens(tok):
    text = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids[0] == tk.START_HEADER_ID and ids[2] == tk.END_HEADER_ID
    assert ids[-1] == tk.EOT_ID
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "user\n\nhi"


def test_chat_template_is_llama3_format(tok):
    messages = [{"role": "system", "content": "You are agent 7."},
                {"role": "user", "content": "  Here is your feed.\n"},
                {"role": "assistant", "content": '{"action": "do_nothing"}'}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are agent 7.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHere is your feed.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{\"action\": \"do_nothing\"}<|eot_id|>")
    prompt = tok.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    enc = tok.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=True)
    ids = list(enc["input_ids"])
    assert ids.count(tk.BOS_ID) == 1 and ids[0] == tk.BOS_ID  # no second bos
    assert ids == tok(prompt, add_special_tokens=False).input_ids
    assert tok.decode(ids) == prompt


def test_left_padded_batch(tok):
    batch = tok(["a much longer sentence than the other", "short"], padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert len(ids[0]) == len(ids[1])
    n_pad = mask[1].count(0)
    assert n_pad > 0 and mask[1] == [0] * n_pad + [1] * (len(mask[1]) - n_pad)
    assert ids[1][:n_pad] == [tk.PAD_ID] * n_pad and ids[1][n_pad] == tk.BOS_ID


def test_committed_assets_match_the_script(tmp_path):
    """The committed files are what scripts/make_tiny_tokenizer.py produces (reproducible)."""
    import importlib.util
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "make_tiny_tokenizer.py")
    spec = importlib.util.spec_from_file_location("make_tiny_tokenizer", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write(str(tmp_path))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        with open(os.path.join(tk.tiny_tokenizer_path(), name), encoding="utf-8") as f:
            committed = json.load(f)
        with open(tmp_path / name, encoding="utf-8") as f:
            assert json.load(f) == committed, name
