"""jaxsocial.models: the Llama-3 policy and its Hugging Face interface.

- `llama`: Flax NNX Llama-3 family (config, presets, forward, KV cache) plus the public
  `from_pretrained` / `save_pretrained` / `load_tokenizer` entry points.
- `checkpoint_hf`: HF `config.json` <-> `LlamaConfig` and safetensors loading/saving.
- `tokenizer`: the committed tiny byte-level BPE tokenizer (`tiny_tokenizer()`).

Import the submodule you need (`from jaxsocial.models import llama`); nothing heavy is
imported here.
"""
