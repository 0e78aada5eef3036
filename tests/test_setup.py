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


@pytest.mark.parametrize("dislike", [0.0, -1.0])
def test_single_policy_reward_weighs_dislikes_where_set(dislike):
    """reward.dislike (and report) enter the single policy's score through five recorded
    channels; at 0 the record and the score stay the three-channel ones."""
    import types

    import jax.numpy as jnp
    import numpy as np

    from jaxsocial.train import epoch as epoch_lib

    c = smoke()
    c.reward.dislike = dislike
    setup = setup_lib.build_setup(c, one_device())
    e = setup.social_params.engagement_channels
    assert e == (5 if dislike else 3)
    social_reward = epoch_lib.make_social_reward(setup)
    # 2 ticks x 2 rows; posts 0 and 1 in slots 0, 1 of a 2-slot ring, row 1 of tick 1 no post
    deltas = np.zeros((2, 2, e), np.int32)
    deltas[0, 0, 0], deltas[1, 1, 0], deltas[1, 1, e - 1] = 2, 3, 4  # likes; the last: dislikes
    ro = types.SimpleNamespace(
        created_id=jnp.array([[0, 1], [-1, -1]]), tick=jnp.array([0, 1]),
        deltas=jnp.asarray(deltas), slot_ids=jnp.array([[0, 1], [0, 1]]),
        agent=jnp.array([[0, 1], [0, 1]]), follower_delta=jnp.zeros((2, 8), jnp.int32))
    score, eng = social_reward(ro)
    assert eng.shape == (2, 2, e)
    likes, dislikes = np.array([2.0, 3.0]), np.array([0.0, 4.0 if e == 5 else 0.0])
    np.testing.assert_allclose(np.asarray(score)[0], likes + dislike * dislikes)
    if dislike:  # negative control: the dislikes moved the score
        assert not np.allclose(np.asarray(score)[0], likes)


def test_the_seed_is_data_of_the_programs_not_a_constant():
    """Two seeds, one embedding program: the reference encoder's random projection (drawn from
    the seed) enters as the encoder's input (`epoch.encoder_input`), so runs that differ only
    in seed share their compiled programs. Control: closed over, it is a constant and the two
    seeds' programs differ."""
    from jaxsocial.train import epoch as epoch_lib

    def lowered(seed, closed):
        c = smoke()
        c.seed = seed
        setup = setup_lib.build_setup(c, one_device())
        weights = jax.eval_shape(functools.partial(setup_lib.init_weights, c, setup))
        encoder = epoch_lib.encoder_input(setup, weights, setup_lib.abstract_text(setup))
        embed = epoch_lib.make_embed(setup)
        tokens = jax.ShapeDtypeStruct((4, setup.social_params.content_len), jax.numpy.int32)
        if closed:
            return jax.jit(lambda r, center, x: embed(r, (center, encoder[1]), x)).lower(
                weights.ref, encoder[0], tokens).as_text()
        return jax.jit(embed).lower(weights.ref, encoder, tokens).as_text()
    assert not (setup_lib.build_setup(smoke(), one_device()).encoder.projection == 0).all()
    assert lowered(0, closed=False) == lowered(1, closed=False)
    assert lowered(0, closed=True) != lowered(1, closed=True)
