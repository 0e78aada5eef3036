"""One decoder, several families: Qwen2/2.5, Qwen3 and Mistral against transformers' PyTorch
models, as tests/test_llama.py does for Llama.

For each family a random transformers model with awkward shapes (head_dim != hidden / heads,
GQA, the family's RoPE theta, perturbed norms and biases) goes through its own
`save_pretrained` into our `checkpoint_hf.from_pretrained`, then:
- logits within 1e-4 on a left-padded ragged batch;
- greedy `jaxsocial.generation.generate` equal to transformers' `generate` token for token
  (prefill + KV-cache decode, sliding windows included);
- export: ours -> `save_pretrained` -> transformers loads the same family with the same keys
  and logits, and our `from_pretrained` of it has equal parameters;
- a negative control per family (qkv bias dropped, QK-norm dropped, sliding window off) that
  the parity check rejects.

Sliding windows: transformers counts a window in cache positions (slots, `kv_idx > q_idx -
window` in masking_utils.sliding_window_overlay), not in position_ids; so does our forward. On a
left-padded row the real tokens are contiguous, so slots and tokens count alike and transformers'
`forward` (explicit position_ids) and `generate` agree; that is the case tested. The windows
here (4) are far shorter than the sequences (up to 23 tokens), so they change the logits.

The training loop's smoke run is done once, with a Qwen3-shaped checkpoint (QK-norm and q/k/v/o
biases): everything above the model is shared by every family, so one run covers them.
"""

import json
import os

import hf_utils
import jax
import numpy as np
import pytest
import torch
import transformers
from conftest import load_config_file
from flax import nnx
from safetensors import safe_open

from jaxsocial import models
from jaxsocial.generation import SamplingConfig, generate
from jaxsocial.models import checkpoint_hf, llama
from jaxsocial.models.tokenizer import tiny_tokenizer
from jaxsocial.rl import lora
from jaxsocial.train import run as run_lib
from jaxsocial.train import sharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ATOL = 1e-4
V = 97
PAD, END = 0, 2

# model_type -> (transformers config class, overrides of hf_utils.TINY_HF_CONFIG).
FAMILIES = {
    # Qwen2/2.5: q/k/v biases (implied by model_type), tied embeddings, theta 1e6, and
    # use_sliding_window with max_window_layers=1: layer 0 full, layer 1 window 4.
    "qwen2": (transformers.Qwen2Config, dict(
        num_key_value_heads=2, head_dim=16, rope_theta=1e6, tie_word_embeddings=True,
        use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    # Qwen3: explicit head_dim, QK-norm, attention_bias (q/k/v/o biases), untied.
    "qwen3": (transformers.Qwen3Config, dict(
        num_key_value_heads=1, head_dim=16, rope_theta=1e6, attention_bias=True)),
    # Mistral: Llama-shaped, one sliding window (4) on every layer.
    "mistral": (transformers.MistralConfig, dict(
        num_key_value_heads=2, head_dim=12, rope_theta=1e6, sliding_window=4)),
}
# The switch each family's negative control drops (parity must then fail).
CONTROLS = {
    "qwen2": dict(qkv_bias=False),
    "qwen3": dict(qk_norm=False),
    "mistral": dict(sliding_window=None),
}


def random_hf_model(model_type, seed=0, **overrides):
    """A float32 transformers *ForCausalLM of `model_type` in eval mode, seeded. Norm weights
    (q_norm / k_norm included) and biases, which transformers sets to 1 and 0, are perturbed so
    that a dropped or swapped one cannot pass."""
    cls, family = FAMILIES[model_type]
    kw = {**hf_utils.TINY_HF_CONFIG, **family, **overrides}
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cls(**kw)).to(torch.float32).eval()
    assert model.config.model_type == model_type
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def load_hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.fspath(path), dtype=torch.float32, local_files_only=True).eval()


def _ids(seed, shape, vocab=V):
    return np.random.RandomState(seed).randint(3, vocab, shape).astype(np.int32)


def left_padded(lengths, total, seed):
    ids = _ids(seed, (len(lengths), total))
    mask = np.arange(total)[None, :] >= total - np.asarray(lengths)[:, None]
    return np.where(mask, ids, PAD).astype(np.int32), mask


def variant(model, **change):
    """`model` with `config.replace(**change)`: the parameters both configs have are copied,
    the others (a dropped bias or norm) are left out."""
    new = llama.Llama(model.config.replace(**change), rngs=nnx.Rngs(0))
    src = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    dst_state = nnx.state(new, nnx.Param)
    dst = nnx.to_pure_dict(dst_state)

    def fill(d, s):
        for k in d:
            if isinstance(d[k], dict):
                fill(d[k], s[k])
            else:
                d[k] = s[k]
    fill(dst, src)
    nnx.replace_by_pure_dict(dst_state, dst)
    nnx.update(new, dst_state)
    return new


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """model_type -> (HF dir, PyTorch model, our model loaded from the dir)."""
    out = {}
    for i, name in enumerate(FAMILIES):
        path = tmp_path_factory.mktemp(name)
        hf = random_hf_model(name, seed=10 + i)
        hf.save_pretrained(os.fspath(path), safe_serialization=True)
        out[name] = (path, hf, checkpoint_hf.from_pretrained(path))
    return out


# ----------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize("name", list(FAMILIES))
def test_switches_come_from_the_hf_config(families, name):
    path, hf, model = families[name]
    cfg = model.config
    assert cfg.model_type == name
    assert cfg.head_dim == hf.config.head_dim != cfg.hidden_size // cfg.num_attention_heads
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.rope_theta == 1e6 and cfg.tie_word_embeddings == (name == "qwen2")
    assert (cfg.qkv_bias, cfg.o_bias, cfg.qk_norm) == {
        "qwen2": (True, False, False), "qwen3": (True, True, True),
        "mistral": (False, False, False)}[name]
    assert cfg.layer_windows == {"qwen2": (None, 4), "qwen3": (None, None),
                                 "mistral": (4, 4)}[name]
    attn = model.layers[0].self_attn
    assert (attn.q_bias is not None, attn.o_bias is not None, attn.q_norm is not None) == (
        cfg.qkv_bias, cfg.o_bias, cfg.qk_norm)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_missing_keys_take_transformers_class_defaults(name):
    """Our defaults table equals what transformers' config class fills in (checked on the
    class's own to_dict(), which spells every key out)."""
    cls, _ = FAMILIES[name]
    ours = checkpoint_hf.config_from_hf({"model_type": name})
    theirs = checkpoint_hf.config_from_hf(cls().to_dict())
    assert ours == theirs
    assert ours.head_dim == 128  # hidden 4096 / 32 heads, or Qwen3's explicit default
    assert ours.sliding_window == (4096 if name == "mistral" else None)


@pytest.mark.parametrize("d,names", [
    (dict(model_type="mistral", num_hidden_layers=2, sliding_window=8,
          layer_types=["full_attention", "sliding_attention"]), ["mistral", "layer_types"]),
    (dict(model_type="qwen2", num_hidden_layers=2, use_sliding_window=False,
          layer_types=["sliding_attention", "full_attention"]), ["use_sliding_window"]),
    (dict(model_type="qwen3", num_hidden_layers=2, use_sliding_window=True, sliding_window=8,
          layer_types=["chunked_attention", "full_attention"]), ["'chunked_attention'"]),
    (dict(model_type="qwen2", mlp_bias=True), ["mlp_bias"]),
    (dict(model_type="gpt_oss"), ["'gpt_oss'", "qwen3", "mistral"]),
])
def test_unsupported_family_config_is_named(d, names):
    with pytest.raises(ValueError) as e:
        checkpoint_hf.config_from_hf(d)
    for n in names:
        assert n in str(e.value), (n, str(e.value))


def test_use_sliding_window_false_means_no_window():
    """Qwen2.5's published configs carry sliding_window but use_sliding_window=false."""
    cfg = checkpoint_hf.config_from_hf(dict(model_type="qwen2", num_hidden_layers=2,
                                            sliding_window=32768, use_sliding_window=False,
                                            max_window_layers=1))
    assert cfg.sliding_window is None and cfg.layer_windows == (None, None)
    assert checkpoint_hf.config_from_hf(
        dict(model_type="mistral", sliding_window=None)).sliding_window is None


def test_export_refuses_switches_its_family_lacks():
    bad = llama.preset("tiny", model_type="qwen2")  # no q/k/v bias: not a Qwen2
    with pytest.raises(ValueError, match="qwen2.*qkv_bias"):
        checkpoint_hf.config_to_hf(bad)
    with pytest.raises(ValueError, match="llama.*sliding_window"):
        checkpoint_hf.config_to_hf(llama.preset("tiny", sliding_window=4))


# ----------------------------------------------------------------------------------------------
# Parity with transformers


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_transformers_on_left_padded_batch(families, name):
    _, hf, model = families[name]
    ids, mask = left_padded([23, 17, 9], 23, seed=1)
    ref = hf_utils.hf_logits(hf, ids, mask)
    ours = hf_utils.our_logits(model, ids, mask)
    diff = np.abs(ours - ref)[mask].max()
    # Negative control: without the family's switch the same check fails.
    wrong = hf_utils.our_logits(variant(model, **CONTROLS[name]), ids, mask)
    wrong_diff = np.abs(wrong - ref)[mask].max()
    print(f"{name}: max |logit diff| {diff:.2e}; without {CONTROLS[name]}: {wrong_diff:.2e}")
    assert diff < ATOL and np.abs(ref).max() > 1e-2
    assert wrong_diff > 100 * ATOL


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_generation_matches_transformers_generate(families, name):
    _, hf, model = families[name]
    ids, mask = left_padded([5, 11, 8], 11, seed=0)
    n = 12
    with torch.no_grad():
        ref = hf.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                          attention_mask=torch.as_tensor(mask.astype(np.int64)), do_sample=False,
                          max_new_tokens=n, eos_token_id=[END], pad_token_id=PAD)
    ref = ref[:, ids.shape[1]:].numpy()
    m = ref.shape[1]
    assert m > 6  # long enough for the window (4) to slide during decode
    # The 16-token prompt bucket in one forward, and in 4 chunks of 4 (each attending to the
    # filled slots only; the sliding window spans chunks).
    for prefill_chunk in (0, 4):
        config = SamplingConfig(max_new_tokens=n, temperature=0.0, stop_token_ids=(END,),
                                prompt_bucket=16, prefill_chunk=prefill_chunk)
        out = generate(model, ids, mask, jax.random.key(0), config)
        np.testing.assert_array_equal(np.asarray(out.tokens)[:, :m], ref)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_scanned_layers_match_transformers(families, name):
    """`scan_layers=True` (the decoder layers as one lax.scan over stacked weights, the KV cache
    one stacked buffer): transformers' logits on a left-padded batch and its greedy tokens,
    sliding and full-attention layers mixed (qwen2, qwen3). Negative control: the layers in
    reverse order miss the logits."""
    _, hf, model = families[name]
    scanned = variant(model, scan_layers=True)
    ids, mask = left_padded([23, 17, 9], 23, seed=1)
    ref = hf_utils.hf_logits(hf, ids, mask)
    assert np.abs(hf_utils.our_logits(scanned, ids, mask) - ref)[mask].max() < ATOL
    ids, mask = left_padded([5, 11, 8], 11, seed=0)
    with torch.no_grad():
        greedy = hf.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                             attention_mask=torch.as_tensor(mask.astype(np.int64)),
                             do_sample=False, max_new_tokens=12, eos_token_id=[END],
                             pad_token_id=PAD)[:, ids.shape[1]:].numpy()
    for decode_buckets in (1, 3):  # one decode loop; three over a growing stacked cache
        out = generate(scanned, ids, mask, jax.random.key(0),
                       SamplingConfig(max_new_tokens=12, temperature=0.0, stop_token_ids=(END,),
                                      prompt_bucket=16, prefill_chunk=4,
                                      decode_buckets=decode_buckets))
        np.testing.assert_array_equal(np.asarray(out.tokens)[:, :greedy.shape[1]], greedy)
    backwards = variant(model, scan_layers=True)
    backwards.layers = nnx.List(list(backwards.layers)[::-1])
    ids, mask = left_padded([23, 17, 9], 23, seed=1)
    assert np.abs(hf_utils.our_logits(backwards, ids, mask) - ref)[mask].max() > 100 * ATOL


@pytest.mark.parametrize("name", list(FAMILIES))
def test_export_round_trip(families, tmp_path, name):
    path, hf, model = families[name]
    ours_dir = tmp_path / "ours"
    checkpoint_hf.save_pretrained(model, ours_dir)
    saved = json.loads((ours_dir / "config.json").read_text())
    assert saved["model_type"] == name
    keys = lambda p: set(safe_open(os.fspath(p / "model.safetensors"), "np").keys())  # noqa: E731
    assert keys(ours_dir) == keys(path)
    back = load_hf(ours_dir)
    assert type(back) is type(hf)
    if name != "mistral":  # MistralConfig has no layer_types
        assert back.config.layer_types == hf.config.layer_types
    assert back.config.sliding_window == hf.config.sliding_window
    ids, mask = left_padded([14, 9], 14, seed=2)
    np.testing.assert_allclose(hf_utils.hf_logits(back, ids, mask)[mask],
                               hf_utils.hf_logits(hf, ids, mask)[mask], atol=1e-5, rtol=0)
    again = checkpoint_hf.from_pretrained(ours_dir)
    assert again.config == model.config
    for a, b in zip(jax.tree.leaves(nnx.state(again, nnx.Param)),
                    jax.tree.leaves(nnx.state(model, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------------------------
# Above the model: sharding names, LoRA, the loader and the training loop


def test_new_parameters_have_logical_names_the_rules_know(families):
    model = families["qwen3"][2]
    names = {}
    for path, v in nnx.iter_graph(model):
        if isinstance(v, nnx.Param):
            names[".".join(map(str, path[-2:]))] = v.get_metadata()["out_sharding"]
    for n in names.values():
        assert all(x in sharding.LOGICAL_AXIS_RULES for x in n), n
    assert names["self_attn.q_bias"] == ("q_heads",) and names["self_attn.k_bias"] == (
        "kv_heads",)
    assert names["self_attn.o_bias"] == ("embed",)
    assert names["q_norm.weight"] == ("norm",)  # replicated
    # Every name maps onto a mesh; the biases split with their projections' heads.
    mesh = sharding.make_mesh((1, 2, 4), jax.devices()[:8])
    shardings = sharding.state_shardings(nnx.state(model), mesh)
    attn = shardings["layers"][0]["self_attn"]
    spec = lambda v: tuple(v.get_value().spec)  # noqa: E731
    assert spec(attn["q_bias"]) == spec(attn["q_proj"])[1:] == ("tensor",)
    assert spec(attn["o_bias"]) == ("fsdp",) and spec(attn["q_norm"]["weight"]) in ((), (None,))


def test_lora_targets_the_projections_not_biases_or_norms(families):
    model = families["qwen3"][2]
    weights = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    adapters = lora.init_adapters(weights, lora.LoraConfig(rank=2), jax.random.key(0))
    attn = adapters["layers"][0]["self_attn"]
    assert set(attn) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert set(adapters["layers"][0]["mlp"]) == {"gate_proj", "up_proj", "down_proj"}
    adapted = lora.adapt(weights, adapters, lora.LoraConfig(rank=2))["layers"][0]["self_attn"]
    assert adapted["q_bias"] is weights["layers"][0]["self_attn"]["q_bias"]
    assert adapted["q_norm"]["weight"] is weights["layers"][0]["self_attn"]["q_norm"]["weight"]


def smoke_checkpoint(path, model_type):
    """A tiny random HF directory of `model_type` (its FAMILIES switches: Qwen2's q/k/v biases,
    tied embeddings and one sliding layer, Qwen3's QK-norm and q/k/v/o biases, Mistral's
    window) with the committed tiny tokenizer (512 tokens, pad 0, bos 1, eos 2, <|eot_id|> 5).
    The embedding has 576 rows: transformers loads a tokenizer beside a qwen2 config as
    Qwen2Tokenizer, which adds <|endoftext|> (513 tokens); spare rows are as in real models."""
    hf = random_hf_model(model_type, seed=5, vocab_size=576, hidden_size=64,
                         intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=256, initializer_range=0.02,
                         bos_token_id=1, eos_token_id=[2, 5], pad_token_id=0)
    hf.save_pretrained(os.fspath(path), safe_serialization=True)
    tiny_tokenizer().save_pretrained(os.fspath(path))
    return path


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory):
    return smoke_checkpoint(tmp_path_factory.mktemp("qwen3_smoke"), "qwen3")


def test_one_loader_reads_any_family(qwen3_checkpoint):
    model, tok, stops = models.load(os.fspath(qwen3_checkpoint))
    assert model.config.model_type == "qwen3" and model.config.qk_norm
    assert len(tok) == 512 and stops == (2, 5)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_training_loop_smoke_per_family(model_type, qwen3_checkpoint, tmp_path):
    """configs/demo.py:smoke with a tiny random checkpoint of a family as model.checkpoint, on
    one device: one epoch of rollout, scoring and a PPO update gives finite metrics. The two
    families whose parameter trees differ from Llama's (qwen2: q/k/v biases, tied embeddings;
    qwen3: q/k norms, o bias) go through the whole loop. Mistral's difference,
    the sliding window, is a mask inside the same attention: the parity and generation tests
    above cover it, and a third loop epoch (about 45 s of compiling) would add nothing."""
    ckpt = qwen3_checkpoint if model_type == "qwen3" else smoke_checkpoint(tmp_path, model_type)
    c = load_config_file("configs/demo.py", "smoke")
    c.model.checkpoint = os.fspath(ckpt)
    c.crowd_text.cache = False  # no pooled-state cache written under the user's cache dir
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    mc = run.setup.model_config
    assert mc.model_type == model_type
    assert {"qwen2": mc.qkv_bias and mc.tie_word_embeddings and mc.layer_types is not None,
            "qwen3": mc.qk_norm and mc.o_bias}[model_type], mc
    state = run.init_state()
    _, metrics, _ = run.run_epoch(state)
    assert metrics["ppo"] and all(np.isfinite(v) for v in metrics["ppo"].values()), metrics["ppo"]
    assert metrics["ppo"]["grad_norm"] > 0  # a real update, not a no-op
