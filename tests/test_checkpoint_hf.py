"""Hugging Face checkpoints: config parsing, save/load round trips through transformers, shards,
dtypes, and the one-line errors for bad directories."""

import json
import os
import shutil

import hf_utils
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from jaxsocial.models import checkpoint_hf, llama
from jaxsocial.models.tokenizer import tiny_tokenizer_path

ATOL = 1e-4

# Llama-3.2-1B-Instruct's config.json as published (transformers 4.45 format).
LLAMA32_1B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}


def _ids(seed, shape, vocab):
    return np.random.RandomState(seed).randint(3, vocab, shape).astype(np.int32)


_ours = hf_utils.our_logits


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A GQA + llama3-rope transformers checkpoint (single file) and its PyTorch model."""
    path = tmp_path_factory.mktemp("hf")
    hf = hf_utils.save_random_hf_model(path, seed=3, num_key_value_heads=2,
                                       rope_scaling=hf_utils.LLAMA3_ROPE_SCALING)
    return path, hf


@pytest.fixture
def broken(hf_dir, tmp_path):
    """A writable copy of hf_dir to damage."""
    dst = tmp_path / "ckpt"
    shutil.copytree(hf_dir[0], dst)
    return dst


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


# ----------------------------------------------------------------------------------------------
# config.json


def test_config_from_hub_llama32_1b_equals_preset():
    cfg = checkpoint_hf.config_from_hf(LLAMA32_1B_CONFIG)
    assert cfg == llama.preset("llama3_2_1b")
    assert cfg.rope_type == "llama3" and cfg.rope_scaling_dict["factor"] == 32.0


def test_config_reads_transformers5_rope_parameters_and_legacy_alike():
    legacy = dict(LLAMA32_1B_CONFIG)
    modern = dict(LLAMA32_1B_CONFIG)
    scaling = modern.pop("rope_scaling")
    modern.pop("rope_theta")
    modern["rope_parameters"] = dict(scaling, rope_theta=500000.0)
    assert checkpoint_hf.config_from_hf(modern) == checkpoint_hf.config_from_hf(legacy)
    # What transformers 5 itself writes is read back to the same config.
    hf_cfg = hf_utils.hf_config(num_key_value_heads=2, head_dim=16,
                                rope_scaling=hf_utils.LLAMA3_ROPE_SCALING).to_dict()
    assert "rope_parameters" in hf_cfg
    cfg = checkpoint_hf.config_from_hf(hf_cfg)
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.rope_theta) == (16, 2, 10000.0)
    assert cfg.rope_scaling_dict == hf_utils.LLAMA3_ROPE_SCALING
    # Older "type" key, and a default rope that is no scaling at all.
    old = dict(legacy, rope_scaling={"type": "linear", "factor": 2.0})
    assert checkpoint_hf.config_from_hf(old).rope_scaling_dict == {"rope_type": "linear",
                                                                   "factor": 2.0}
    plain = dict(modern, rope_parameters={"rope_type": "default", "rope_theta": 1234.0})
    cfg = checkpoint_hf.config_from_hf(plain)
    assert cfg.rope_scaling is None and cfg.rope_theta == 1234.0


def test_config_to_hf_round_trips_and_transformers_reads_it():
    import transformers
    for cfg in (llama.preset("tiny"), llama.preset("llama3_2_1b"), llama.preset("llama3_8b")):
        d = checkpoint_hf.config_to_hf(cfg)
        json.dumps(d)  # serialisable
        assert checkpoint_hf.config_from_hf(d) == cfg.replace(dtype="float32",
                                                              param_dtype="float32")
        hf = transformers.LlamaConfig(**{k: v for k, v in d.items() if k != "model_type"})
        assert hf.rope_parameters["rope_theta"] == cfg.rope_theta
        assert hf.rope_parameters["rope_type"] == cfg.rope_type
        assert hf.head_dim == cfg.head_dim and hf.tie_word_embeddings == cfg.tie_word_embeddings


# ----------------------------------------------------------------------------------------------
# Save / load


def test_our_save_loads_in_transformers_with_same_logits(tmp_path):
    for i, overrides in enumerate([{}, dict(tie_word_embeddings=True, head_dim=32)]):
        cfg = llama.preset("tiny", **overrides)
        model = llama.init(cfg, seed=i)
        # Unit norms would hide a dropped norm weight: perturb them.
        for layer in model.layers:
            layer.input_layernorm.weight[...] = 1.0 + 0.3 * jnp.sin(jnp.arange(cfg.hidden_size))
        path = tmp_path / f"ours{i}"
        checkpoint_hf.save_pretrained(model, path)
        assert sorted(os.listdir(path)) == ["config.json", "generation_config.json",
                                            "model.safetensors"]
        with safe_open(str(path / "model.safetensors"), framework="numpy") as f:
            assert ("lm_head.weight" in f.keys()) != cfg.tie_word_embeddings
            assert f.get_slice("model.layers.0.self_attn.q_proj.weight").get_shape() == [
                cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size]
        hf = hf_utils.load_hf_model(path)
        assert hf.config.tie_word_embeddings == cfg.tie_word_embeddings
        ids = _ids(i, (2, 20), cfg.vocab_size)
        mask = np.ones((2, 20), bool)
        mask[0, :6] = False
        ours = _ours(model, ids, mask)
        np.testing.assert_allclose(ours[mask], hf_utils.hf_logits(hf, ids, mask)[mask],
                                   atol=ATOL, rtol=0)
        # ... and our loader reads our own save back exactly.
        back = checkpoint_hf.from_pretrained(path)
        assert back.config == cfg
        np.testing.assert_array_equal(_ours(back, ids, mask), ours)


def test_sharded_checkpoints_with_index(tmp_path, hf_dir):
    _, hf_ref = hf_dir
    ids = _ids(0, (2, 16), 97)
    ref = hf_utils.hf_logits(hf_ref, ids)
    # transformers writes shards + index; we load them.
    hf_utils.save_random_hf_model(tmp_path / "hf", seed=3, max_shard_size="20KB",
                                  num_key_value_heads=2,
                                  rope_scaling=hf_utils.LLAMA3_ROPE_SCALING)
    files = os.listdir(tmp_path / "hf")
    assert checkpoint_hf.INDEX_FILE in files
    assert sum(f.endswith(".safetensors") for f in files) > 2
    model = checkpoint_hf.from_pretrained(tmp_path / "hf")
    np.testing.assert_allclose(_ours(model, ids), ref, atol=ATOL, rtol=0)
    # We write shards + index above the threshold; transformers and we load them.
    out = tmp_path / "ours"
    checkpoint_hf.save_pretrained(model, out)  # single file first: a re-save must replace it
    checkpoint_hf.save_pretrained(model, out, max_shard_bytes=30_000)
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.endswith(".safetensors")]
    assert checkpoint_hf.SINGLE_FILE not in files and len(shards) > 2
    index = json.loads((out / checkpoint_hf.INDEX_FILE).read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(
        v[...].nbytes for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Param))
    np.testing.assert_allclose(hf_utils.hf_logits(hf_utils.load_hf_model(out), ids), ref,
                               atol=ATOL, rtol=0)
    np.testing.assert_array_equal(_ours(checkpoint_hf.from_pretrained(out), ids), _ours(model, ids))


def test_bfloat16_checkpoint_loads_and_saves(tmp_path, hf_dir):
    _, hf = hf_dir
    hf16 = hf_utils.random_hf_model(seed=3, num_key_value_heads=2,
                                    rope_scaling=hf_utils.LLAMA3_ROPE_SCALING).to(torch.bfloat16)
    hf16.save_pretrained(tmp_path / "bf16")
    q = hf16.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()
    # bf16 file -> float32 params: exactly the bf16 values, transposed.
    m32 = checkpoint_hf.from_pretrained(tmp_path / "bf16")
    np.testing.assert_array_equal(np.asarray(m32.layers[1].self_attn.q_proj[...]), q.T)
    # bf16 file -> bf16 params -> our bf16 save: bit-identical tensors.
    m16 = checkpoint_hf.from_pretrained(tmp_path / "bf16", dtype="bfloat16")
    checkpoint_hf.save_pretrained(m16, tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="numpy") as a, \
            safe_open(str(tmp_path / "again" / "model.safetensors"), framework="numpy") as b:
        assert set(a.keys()) == set(b.keys())
        for k in a.keys():
            ta, tb = a.get_tensor(k), b.get_tensor(k)
            assert ta.dtype == tb.dtype == jnp.bfloat16
            np.testing.assert_array_equal(ta.view(np.uint16), tb.view(np.uint16))


def test_loading_is_tensor_by_tensor(tmp_path):
    """Host (numpy) memory while loading peaks near one tensor, far below the whole checkpoint.
    tracemalloc sees numpy buffers, not JAX device buffers (the loaded model itself)."""
    import tracemalloc
    hf = hf_utils.save_random_hf_model(tmp_path, hidden_size=128, intermediate_size=256,
                                       vocab_size=256, num_hidden_layers=4)
    total = sum(p.numel() * 4 for p in hf.parameters())
    checkpoint_hf.from_pretrained(tmp_path)  # warm caches (tracing, imports) before measuring
    tracemalloc.start()
    try:
        checkpoint_hf.from_pretrained(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < total / 3, (peak, total)


# ----------------------------------------------------------------------------------------------
# Errors: one line, naming the bad value.


def _raises(exc, fn, *names):
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for name in names:
        assert name in msg, (name, msg)
    return msg


def test_missing_directory_and_config(tmp_path):
    _raises(FileNotFoundError, lambda: checkpoint_hf.from_pretrained(tmp_path / "nope"), "nope")
    (tmp_path / "empty").mkdir()
    _raises(FileNotFoundError, lambda: checkpoint_hf.from_pretrained(tmp_path / "empty"),
            "config.json", "empty")
    _raises(FileNotFoundError, lambda: checkpoint_hf.load_tokenizer(tmp_path / "nope"), "nope")


def test_missing_tensor(broken):
    name = "model.layers.1.mlp.up_proj.weight"
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors[name]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    _raises(ValueError, lambda: checkpoint_hf.from_pretrained(broken), repr(name))


def test_missing_shard(tmp_path):
    hf_utils.save_random_hf_model(tmp_path, max_shard_size="20KB")
    shard = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))[-1]
    os.remove(tmp_path / shard)
    _raises(FileNotFoundError, lambda: checkpoint_hf.from_pretrained(tmp_path), shard)


def test_shape_mismatch(broken):
    _edit_config(broken, intermediate_size=48)
    _raises(ValueError, lambda: checkpoint_hf.from_pretrained(broken),
            "'model.layers.0.mlp.gate_proj.weight'", "(48, 32)", "(64, 32)")


def test_unexpected_tensor(broken):
    _edit_config(broken, num_hidden_layers=1)
    _raises(ValueError, lambda: checkpoint_hf.from_pretrained(broken), "model.layers.1.")


@pytest.mark.parametrize("changes,names", [
    (dict(model_type="gemma"), ["'gemma'", "model_type", "qwen3"]),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
     ["'yarn'", "rope type"]),
    (dict(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}),
     ["'dynamic'", "rope type"]),
    (dict(hidden_act="gelu"), ["'gelu'"]),
    (dict(attention_bias=True), ["attention_bias"]),
])
def test_unsupported_config(broken, changes, names):
    _edit_config(broken, **changes)
    _raises(ValueError, lambda: checkpoint_hf.from_pretrained(broken), *names)
    _raises(ValueError, lambda: checkpoint_hf.config_from_hf(broken / "config.json"), *names)


# ----------------------------------------------------------------------------------------------
# Tokenizers


def test_load_tokenizer_checks_vocab_fits_model(tmp_path, hf_dir):
    path, _ = hf_dir
    tok_dir = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer_path(), tok_dir)
    small = checkpoint_hf.from_pretrained(path)  # vocab 97 < the tokenizer's 512 tokens
    _raises(ValueError, lambda: checkpoint_hf.load_tokenizer(tok_dir, model=small), "512", "97")
    _raises(ValueError, lambda: checkpoint_hf.load_tokenizer(tok_dir, model=small.config),
            "512", "97")
    tok = checkpoint_hf.load_tokenizer(tok_dir, model=llama.preset("tiny"))
    assert len(tok) == 512
    assert tok("hi").input_ids[0] == llama.preset("tiny").bos_token_id
