"""One Social-RL run: its set-up, initial weights, text banks and compiled epoch programs.

    run = build_run(config)                # set-up, weights, text banks, programs
    state = run.init_state()               # RunState: train state, society, key, epoch
    state, metrics, samples = run.run_epoch(state)

A `Run` holds what `train.setup` built and the epoch's programs (`train.epoch.make_epoch`),
and drives one epoch: one donated program (`Run.epoch`), or, when a reward is computed on the
host (the code bonus), the same pieces as three programs (rollout, scoring, update) with the
bonus in between. Metrics, samples and interviews are `train.host`'s; `Run.export_policy`
writes the policy as a Hugging Face directory.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from jaxsocial.models import checkpoint_hf
from jaxsocial.rl import lora as lora_lib
from jaxsocial.train import checks, dataset, fit, host, sharding
from jaxsocial.train import cohorts as cohorts_lib
from jaxsocial.train import epoch as epoch_lib
from jaxsocial.train import setup as setup_lib
from jaxsocial.train.epoch import EpochFns
from jaxsocial.train.setup import RunState, Setup, Text, Weights


class BindFrozen:
    """A jitted function called with frozen inputs bound as keywords (the grammar, the society
    encoder's input): `f(*args)` / `f.lower(*args)` pass them as traced arguments of the
    compiled program (never baked constants)."""

    def __init__(self, jitted, **frozen):
        self.jitted, self.frozen = jitted, frozen

    def __call__(self, *args):
        return self.jitted(*args, **self.frozen)

    def lower(self, *args):
        return self.jitted.lower(*args, **self.frozen)


class _Traces:
    """How many times the one-program epoch was traced (one per compiled epoch shape)."""

    def __init__(self, fn):
        self.fn, self.count = fn, 0

    def __call__(self, *args):
        self.count += 1
        return self.fn(*args)


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """A built run (`build_run`): set-up, initial weights (the reference), text banks, the
    epoch's pure functions and their compiled programs."""

    setup: Setup
    weights: Weights
    text: Text
    fns: EpochFns
    encoder: Any          # the society encoder's frozen input (`epoch.encoder_input`)
    rollout: BindFrozen   # (params, ref_params, society, key) -> (society, Rollout)
    score: BindFrozen     # (train, Rollout, bonus) -> (Trajectory, score, engagement, gap)
    view: Any             # jitted fns.view
    epoch: Any            # (state, grammar, encoder) -> (state, update metrics, view), donated
    traces: _Traces       # `traces.count`: how many times the one-program epoch was traced
    # `compile_epoch`'s executable, once asked for (then `run_epoch` runs it: one compile)
    compiled: dict = dataclasses.field(default_factory=dict)

    @property
    def config(self) -> ml_collections.ConfigDict:
        return self.setup.config

    @property
    def mesh(self):
        return self.setup.mesh

    def init_state(self) -> RunState:
        """Fresh run: initial policy (= reference), society reset, keys from config.seed."""
        return setup_lib.init_state(self.setup, self.weights, self.text)

    def place(self, state: RunState) -> RunState:
        return setup_lib.place(self.setup, state)

    def with_setup(self, setup: Setup) -> "Run":
        """This run's weights and text banks with another set-up of the same shapes (e.g. a
        smaller micro-batch, `setup.with_micro_batch`), its programs built anew."""
        return Run(setup=setup, weights=self.weights, text=self.text,
                   **programs(setup, self.weights, self.text))

    def compile_epoch(self, state: RunState):
        """The one-program epoch compiled for `state`'s shapes and shardings (XLA's
        `memory_analysis()` of it is `fit.fit_run`'s memory model); later epochs run this
        executable."""
        if "epoch" not in self.compiled:
            self.compiled["epoch"] = self.epoch.lower(
                state, self.setup.grammar, self.encoder).compile()
            fit.release_freed_memory()  # what the compile freed, before the memory is judged
        return self.compiled["epoch"]

    def run_epoch(self, state: RunState) -> Tuple[RunState, Dict[str, Any], List[dict]]:
        """Rollout + reward + update. Returns (new state, metrics dict, text samples)."""
        if self.setup.fused:
            t0 = time.perf_counter()
            epoch = self.compiled.get("epoch", self.epoch)
            new, upd, view = epoch(state, self.setup.grammar, self.encoder)
            jax.block_until_ready(new.train.step)
            wall = t_roll = time.perf_counter() - t0
            bonus = None
        else:
            new, upd, view, bonus, wall, t_roll = self._three_programs(state)
        view, upd = sharding.to_host((view, upd))
        metrics = host.epoch_metrics(self.setup, self.text, view, upd, wall, t_roll)
        metrics["epoch"] = int(sharding.to_host(new.epoch))
        new = self._copy_adapters(new, metrics)
        metrics.update(host.society_metrics(self.setup, new))
        if view.steps is not None:  # train.dataset: the runner writes them (and pops them)
            metrics["episodes"] = dataset.episodes(self.setup, view, metrics["epoch"])
        if self.setup.code:
            metrics["code_passed"] = int((bonus > 0).sum())
        return new, metrics, host.samples(self.setup, view, metrics["epoch"])

    def _three_programs(self, state: RunState):
        """The host-reward path: the fused epoch's `begin`, rollout, scoring, update and `end`
        as three programs, the code bonus computed on the host in between."""
        t0 = time.perf_counter()
        key, k_roll = self.fns.begin(state)
        soc, ro = self.rollout(state.train.params, state.train.ref_params, state.society, k_roll)
        jax.block_until_ready(ro.tokens)
        t_roll = time.perf_counter() - t0
        # The whole rollout comes to the host only for the host-side code bonus.
        bonus = (host.code_bonus(self.setup, sharding.to_host(ro)) if self.setup.code
                 else np.zeros(ro.created_id.shape, np.float32))
        batch, score, eng, gap = self.score(state.train, ro, jnp.asarray(bonus))
        # Trajectories along the data axes (rows that don't divide stay replicated).
        batch = sharding.put_global(batch, sharding.tree_data_shardings(batch, self.mesh))
        train, upd = self.setup.update(state.train, batch)
        jax.block_until_ready(train.step)
        wall = time.perf_counter() - t0
        new = self.place(self.fns.end(state, key, soc, train))
        return new, upd, self.view(ro, score, eng, gap), bonus, wall, t_roll

    def _copy_adapters(self, state: RunState, metrics: Dict[str, Any]) -> RunState:
        """agents.cohorts' `copy_from`: after the epoch, a cohort takes another's adapter
        (`cohorts.copies`, decided on the host from the epoch's per-cohort rewards, so a resumed
        run makes the same copies); recorded as `cohorts.<name>.copied_from`."""
        co = self.setup.cohorts
        if co is None or not any(co.copy_from):
            return state
        moves = cohorts_lib.copies(co, metrics["epoch"], {
            n: m["reward_mean"] for n, m in metrics["cohorts"].items()})
        for dst, src in moves.items():
            metrics["cohorts"][dst]["copied_from"] = src
        if not moves:
            return state
        return self.place(state.replace(train=cohorts_lib.copy_adapters(co, state.train, moves)))

    def export_policy(self, state: RunState, path: str, write: bool = True,
                      initial: bool = False, cohort: Optional[str] = None) -> None:
        """Write the current policy as a complete Hugging Face directory: weights, config.json,
        generation_config.json (eos = the run's stop ids) (`checkpoint_hf.save_pretrained`)
        and the tokenizer with its chat template, so `AutoTokenizer` /
        `AutoModelForCausalLM` and `launch/eval.py` load it as it is. initial: the run's
        initial policy instead (the frozen reference: the weights before any update). cohort:
        with cohorts, the name of the trainable cohort whose adapter is merged in (the run's
        exports: `host.export_names`). Multi-process: every process must call it (the weights
        are gathered); `write` only on one."""
        setup, train = self.setup, state.train
        if initial:
            weights = train.ref_params
        elif setup.cohorts is not None:
            co = setup.cohorts
            if cohort not in co.names or not co.trainable[co.names.index(cohort)]:
                raise ValueError(f"cohort={cohort!r}: export one of the trainable cohorts "
                                 f"{[co.names[c] for c in co.trained]}")
            adapters = cohorts_lib.cohort_params(train, co.slots[co.names.index(cohort)])
            weights = lora_lib.merged_weights_for_export(train.ref_params, adapters["policy"],
                                                         setup.pdef.lora)
        elif setup.pdef.lora is not None:
            weights = lora_lib.merged_weights_for_export(train.ref_params,
                                                         train.params["policy"], setup.pdef.lora)
        else:
            weights = train.params["policy"]
        on_host = sharding.to_host(weights)
        if write:
            model = nnx.merge(setup.pdef.graphdef, on_host)
            model.config = model.config.replace(eos_token_id=tuple(setup.stop_ids))
            checkpoint_hf.save_pretrained(model, path)
            setup.tokenizer.save_pretrained(path)


def programs(setup: Setup, weights: Weights, text: Text) -> Dict[str, Any]:
    """The epoch's pure functions and compiled programs for `Run`'s fields (weights and text
    may be abstract: the programs only need their shapes)."""
    fns = epoch_lib.make_epoch(setup)
    encoder = epoch_lib.encoder_input(setup, weights, text)
    traces = _Traces(fns.epoch)
    sh = setup_lib.run_state_shardings(setup, setup_lib.abstract_state(setup, weights, text))
    rep = sharding.replicated(setup.mesh)
    # The grammar enters each compiled program as an argument: closed over, XLA would bake
    # its [S, V] tables in as constants (and spend minutes constant-folding them).
    return dict(
        fns=fns, encoder=encoder, traces=traces,
        rollout=BindFrozen(jax.jit(fns.rollout), grammar=setup.grammar, encoder=encoder),
        score=BindFrozen(jax.jit(fns.score_rollout), grammar=setup.grammar),
        view=jax.jit(fns.view),
        # state shardings pinned (as `place` gives them) and the state donated
        epoch=jax.jit(traces, donate_argnums=0, in_shardings=(sh, rep, rep),
                      out_shardings=(sh, rep, rep)))


def build_run(config: ml_collections.ConfigDict, mesh=None, checked: bool = False) -> Run:
    """The run of `config`: the config checked (`checks.check`) and its state against this
    machine (`fit.check_state`) unless the caller has (checked=True), then `setup.build_setup`,
    `setup.init_weights`, `setup.embed_text` and the epoch's programs."""
    if not checked:
        checks.check(config)
        fit.check_state(config, mesh)
    setup = setup_lib.build_setup(config, mesh, checked=True)
    weights = setup_lib.init_weights(config, setup)
    text = setup_lib.embed_text(setup, weights)
    return Run(setup=setup, weights=weights, text=text, **programs(setup, weights, text))


def abstract_run(config: ml_collections.ConfigDict, mesh=None,
                 model_config: Optional[Any] = None, checked: bool = False) -> Run:
    """The run of `config` with ShapeDtypeStruct weights and text banks: nothing is read or
    allocated, so its programs can be compiled for another machine (`scale.aot`). The config's
    checkpoint (if any) is replaced by its preset; model_config: a `LlamaConfig` to build for
    instead (e.g. fewer layers). This machine's memory is not checked; checked=True: nor the
    config (the caller has)."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.model.checkpoint = ""
        config.model.require_checkpoint = False
    setup = setup_lib.build_setup(config, mesh, checked=checked, model_config=model_config)
    weights = jax.eval_shape(lambda: setup_lib.init_weights(config, setup))
    text = setup_lib.abstract_text(setup)
    return Run(setup=setup, weights=weights, text=text, **programs(setup, weights, text))
