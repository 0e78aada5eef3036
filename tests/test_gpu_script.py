"""benchmarks/gpu.sh, the script a lent GPU runs in one call: its GPU rows' config overrides
are keys of configs/general.py that pass the config check (no GPU here, so the rows themselves
run only on the device; `benchmarks/gpu.sh --dry` runs them at tiny shapes on a CPU)."""
import ast
import os
import re

import pytest
from conftest import ROOT, load_config_file

from jaxsocial.train import checks


def gpu_overrides(text: str):
    """The --config.KEY=VALUE arguments of the script's GPU branch (COMMON and ONEB)."""
    gpu = text.split("else\n", 1)[1].split("\nfi\n", 1)[0]
    return re.findall(r"--config\.([\w.]+)=('[^']*'|[^\s)]+)", gpu)


def apply(config, pairs):
    for key, raw in pairs:
        value = raw.strip("'")
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        node = config
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        if last not in node:
            raise KeyError(f"--config.{key} is not a key of configs/general.py")
        node[last] = value
    return config


def test_the_gpu_rows_use_keys_the_config_knows():
    with open(os.path.join(ROOT, "benchmarks", "gpu.sh"), encoding="utf-8") as f:
        text = f.read()
    pairs = gpu_overrides(text)
    assert len(pairs) >= 10 and ("rl.num_minibatches", "4") in pairs
    c = apply(load_config_file("configs/general.py"), pairs)
    c.model.checkpoint = ""  # SMOL's GGUF path exists only on the device
    checks.check(c)
    assert "--dry" in text and "decode_8b" in text and "compiled_gb" in text
    # negative control: an old key name is refused
    with pytest.raises(KeyError, match="rl.minibatches"):
        apply(load_config_file("configs/general.py"), [("rl.minibatches", "4")])
