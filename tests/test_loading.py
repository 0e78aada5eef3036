"""models.load: the one loader (model, tokenizer, stop ids) and its stop-token rule."""
import numpy as np
import pytest

from jaxsocial import models
from jaxsocial.models import checkpoint_hf, llama, loading
from jaxsocial.models.tokenizer import llama32_tokenizer, tiny_tokenizer


def test_end_of_turn_comes_from_the_chat_template():
    tiny = tiny_tokenizer()
    assert loading.end_of_turn_id(tiny) == tiny.convert_tokens_to_ids("<|eot_id|>") == 5
    l32 = llama32_tokenizer()
    assert loading.end_of_turn_id(l32) == l32.convert_tokens_to_ids("<|eot_id|>")
    assert l32.eos_token_id != loading.end_of_turn_id(l32)  # eos alone would miss it
    assert loading.stop_token_ids(l32) == tuple(sorted({l32.eos_token_id, 128009}))
    # ChatML (SmolLM2's template): the turn ends with <|im_end|>
    l32.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                         "<|eot_id|>\n{% endfor %}")
    assert loading.end_of_turn_id(l32) == 128009
    l32.chat_template = None
    assert loading.end_of_turn_id(l32) is None


def test_preset_and_checkpoint_give_the_same_rule(tmp_path):
    model, tok, stops = models.load("tiny", seed=3)
    assert isinstance(model, llama.Llama) and len(tok) <= model.config.vocab_size
    # tokenizer eos 5 (= end of turn) + the config's eos ids (2, 5)
    assert stops == (2, 5)
    again, _, _ = models.load("tiny", seed=3)
    np.testing.assert_array_equal(np.asarray(model.embed_tokens[...]),
                                  np.asarray(again.embed_tokens[...]))
    checkpoint_hf.save_pretrained(model, tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, tok2, stops2 = models.load(str(tmp_path))
    assert stops2 == stops and len(tok2) == len(tok)
    np.testing.assert_array_equal(np.asarray(loaded.embed_tokens[...]),
                                  np.asarray(model.embed_tokens[...]))
    assert models.load(str(tmp_path), remat=True)[0].config.remat


def test_bad_input_names_the_value(tmp_path):
    with pytest.raises(ValueError, match="'tinyy' is neither"):
        models.load("tinyy")
    with pytest.raises(ValueError, match="nothing to load"):
        models.load("")
    with pytest.raises((FileNotFoundError, ValueError), match="no_such_dir"):
        models.load(str(tmp_path / "no_such_dir"))
    small = llama.preset("tiny").vocab_size
    with pytest.raises(ValueError, match=f"{small} rows"):
        models.load("tiny", tokenizer=llama32_tokenizer())
