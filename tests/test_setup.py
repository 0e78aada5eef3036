"""The set-up as data (`train.setup`): built without weights, frozen, and the same shapes
abstractly (`jax.eval_shape` of the trainer's own initialiser) as concretely."""
import dataclasses
import functools

import jax
import pytest
from conftest import load_config_file

from jaxsocial.models import checkpoint_hf, loading
from jaxsocial.train import setup as setup_lib
from jaxsocial.train import sharding


def smoke():
    return load_config_file("configs/demo.py", "smoke")


def one_device():
    return sharding.make_mesh((1, 1, 1), jax.devices()[:1])


def shapes(tree):
    return jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)


def test_build_setup_reads_no_weight(monkeypatch):
    def no_weights(*a, **k):
        raise AssertionError("a weight was loaded")
    monkeypatch.setattr(loading, "load_model", no_weights)
    setup = setup_lib.build_setup(smoke(), one_device())
    assert setup.model_config == loading.load_config("tiny", "float32", "float32",
                                                     remat=False, attention_chunk=0,
                                                     scan_layers=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.active = 3  # frozen: what an epoch is built from cannot drift
    # negative control: the weights themselves come through the patched loader
    with pytest.raises(AssertionError, match="a weight was loaded"):
        setup_lib.init_weights(smoke(), setup)


def test_abstract_weights_and_text_have_the_concrete_shapes():
    c = smoke()
    setup = setup_lib.build_setup(c, one_device())
    weights = setup_lib.init_weights(c, setup)
    abstract = jax.eval_shape(functools.partial(setup_lib.init_weights, c, setup))
    assert isinstance(jax.tree.leaves(abstract)[0], jax.ShapeDtypeStruct)
    assert shapes(abstract) == shapes(weights)
    text = setup_lib.embed_text(setup, weights)
    assert shapes(setup_lib.abstract_text(setup)) == shapes(text)
    assert text.center is not None and text.agent_interest.shape[0] == setup.num_agents
    # The abstract state is the concrete state's shapes, with the shardings `place` gives.
    state = setup_lib.init_state(setup, weights, text)
    abstract_state = setup_lib.abstract_state(setup, abstract, setup_lib.abstract_text(setup))
    assert shapes(abstract_state) == shapes(state)
    # negative control: a set-up for more agents has other text shapes
    c.agents.num_agents = setup.num_agents + 2
    c.society.num_users = max(int(c.society.num_users), c.agents.num_agents)
    bigger = setup_lib.abstract_text(setup_lib.build_setup(c, one_device()))
    assert shapes(bigger) != shapes(text)


def test_init_weights_refuses_a_set_up_for_another_model(tmp_path):
    c = smoke()
    cfg = loading.load_config("tiny", "float32", "float32", remat=False, attention_chunk=0,
                              scan_layers=False)
    setup = setup_lib.build_setup(c, one_device(), model_config=cfg.replace(
        num_hidden_layers=cfg.num_hidden_layers + 1))
    weights = setup_lib.init_weights(c, setup)  # a preset: built for the given config
    assert len(weights.ref["layers"]) == cfg.num_hidden_layers + 1
    # A checkpoint must match the set-up it is loaded into.
    model, tokenizer, _ = loading.load("tiny")
    checkpoint_hf.save_pretrained(model, str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    c.model.checkpoint = str(tmp_path)
    with pytest.raises(ValueError, match="set-up was built for"):
        setup_lib.init_weights(c, setup)
    # control: the set-up of that checkpoint loads it
    setup_lib.init_weights(c, setup_lib.build_setup(c, one_device()))
