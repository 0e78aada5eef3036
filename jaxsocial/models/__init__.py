"""jaxsocial.models: the policy decoder (Llama-3, Qwen2/2.5, Qwen3, Mistral) and its checkpoint
formats.

- `load(path_or_preset) -> (model, tokenizer, stop_ids)`: the one loader (`loading.py`), used
  by the training loop and the chat engine (`jaxsocial.agents.chat.ChatModel`).
- `llama`: the Flax NNX decoder (config with the families' switches, presets, forward, KV
  cache).
- `checkpoint_hf`: Hugging Face I/O for every family: `from_pretrained` (safetensors
  directories and llama GGUF files), `save_pretrained`, `load_tokenizer`, config.json <->
  `LlamaConfig`.
- `gguf`: llama.cpp's GGUF format (dequantization, tokenizer from metadata); `hf_layout`: the
  HF tensor names both readers fill.
- `zoo`: pretrained models fetched on first use (`smollm2_135m_instruct()`).
- `tokenizer`: the committed tiny byte-level BPE tokenizer (`tiny_tokenizer()`) and Llama-3.2's.

Import the submodule you need (`from jaxsocial.models import llama`); importing the package
itself loads nothing heavy.
"""


def load(path_or_preset, dtype=None, param_dtype=None, **kwargs):
    """`loading.load`: -> (model, tokenizer, stop_ids) for a checkpoint path or a preset."""
    from jaxsocial.models import loading  # deferred: `import jaxsocial.models` stays light
    return loading.load(path_or_preset, dtype, param_dtype, **kwargs)
