"""One RL step, ours vs TRL's `GRPOTrainer`, same 19M Llama, same batch and settings.

    pip install -e '.[bench]'      # trl==1.16.0, peft==0.21.2 (benchmark only)
    python benchmarks/rl_step.py                       # GRPO: ours vs TRL; PPO: ours
    python benchmarks/rl_step.py --lora                # + LoRA: ours vs TRL + PEFT
    python benchmarks/rl_step.py --steps 3 --skip_trl  # ours only

Setting: preset `small_20m` (float32, random weights, gradient
checkpointing off on both sides), 4 prompts x 8 samples, 128 prompt + 64 new tokens (no stop
token: every response has 64 tokens; TRL: min_new_tokens=64), lr 1e-5, KL beta 0.04 (k3),
clip 0.2, one optimisation epoch of one minibatch, temperature 1, no top-k / top-p. Reward
(both sides): the fraction of response tokens with an id below vocab / 2.

One step = generation (sampling the 32 responses) + scoring (reward, old / reference
log-probs, values) + update (forward, backward, clip + AdamW). Ours: `generate`, then
`policy.score_batch` with the rollout's log-probs (`old_logprobs="auto"`: reused in float32,
so only the reference forward runs for GRPO), then `grpo.make_update` / `ppo.make_update`.
TRL: `GRPOTrainer.train(max_steps=warmup + steps)` on an HF `LlamaForCausalLM` holding the
same weights; its phases are timed by wrapping `_generate` (generation),
`_generate_and_score_completions` (minus generation = scoring: rewards + reference forward;
with one iteration TRL skips the old-log-prob forward) and the step callbacks (the rest =
update). Each side: `--warmup` untimed steps, then the median of `--steps` steps; each of our
GRPO rows runs before and after TRL and the two runs are pooled (the load of a shared machine
drifts).

Fair by default: TRL gets as many torch threads as JAX has cores (`--torch_threads 0`);
a smaller `--torch_threads` is printed and recorded as a handicap. Both sides float32, the
same batch, the same sampling (T=1, no top-k / top-p, exactly `--new` tokens). On a loaded
machine torch's OpenMP threads can degrade badly (at load ~5 on 2 cores a TRL step took 56 s
with 2 threads, 18 s with 1), so measure at idle; to compare on fewer cores, restrict both
sides alike (`taskset -c 0 python benchmarks/rl_step.py`: JAX and torch then see one core).

Prompt sharing: ours can run each prompt's forward once per group of `--group` samples
(`prompt_group`, in generation's prefill, in scoring and in the update), which TRL does not
do, and which the social loop cannot use (its prompts all differ). So every GRPO and PPO row is
printed twice, each with its ratio to TRL: with prompt sharing (`prompt_group=--group`) and
without it (`prompt_group=0`, as the social loop runs). `--ablate` adds a row without sharing
and with re-scoring (the old log-probs recomputed by a forward instead of reused).

LoRA (`--lora`): ours GRPO training a LoRA only (`lora.LoraConfig(--lora_rank, --lora_alpha)`
on q, k, v, o, gate, up, down; `init_policy(..., lora=...)`), without prompt sharing, against
`GRPOTrainer` given PEFT's `LoraConfig` of the same rank, alpha and target modules (no dropout,
no bias) as `peft_config`; everything else as above, and our LoRA row too runs before and after
TRL, pooled. Neither side keeps a second model for the KL term: with PEFT, TRL computes the
reference log-probs with the adapter disabled; ours uses the frozen base weights as the
reference as they are (no copy). Both sides must train only the adapters: our trainable count
(the optimizer's parameters) must equal PEFT's `get_nb_trainable_parameters()` (itself checked
against torch's requires_grad), else the run fails; both counts are printed and recorded.

PPO: trl 1.16.0 has no `PPOTrainer` (it was removed from trl; nothing in `trl.experimental`
either), so our PPO step (value head on the policy trunk, GAE, clipped value loss) is timed
alone and compared against TRL's GRPO step as the nearest peer (TRL's PPO did strictly more
work than its GRPO: policy + value + reference forwards and a value backward).

Summary line: `ours_step_s=... trl_step_s=... ratio=... ours_unshared_step_s=...
ratio_unshared=...` (GRPO; ratio = trl / ours, > 1: ours is faster; `ours_step_s` with prompt
sharing, `ours_unshared_step_s` without), with `--lora` followed by `ours_lora_step_s=...
trl_lora_step_s=... ratio_lora=...` (the result file adds `ours_lora_trainable`,
`trl_lora_trainable`, `lora_rank`, `lora_alpha`, `lora_targets`), then `result: <file>`
(benchmarks/results/) and the machine line, last.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import NO_RECORD_HELP, finish, resolve_threads, thread_handicap  # benchmarks/
from flax import nnx
from generate import torch_model  # benchmarks/: our weights in a transformers Llama

from jaxsocial.generation import generate
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import llama
from jaxsocial.rl import buffer, grpo, optim, ppo
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl import policy as policy_lib


def reward_np(ids: np.ndarray, vocab: int) -> np.ndarray:
    """[B, R] response ids -> [B] fraction of ids below vocab / 2 (the trivial reward)."""
    return (np.asarray(ids) < vocab // 2).mean(axis=-1).astype(np.float32)


def make_prompts(args, vocab: int) -> np.ndarray:
    """[prompts, prompt_len] int32 random ids (>= 10: no special tokens), no padding."""
    rs = np.random.RandomState(args.seed)
    return rs.randint(10, vocab, (args.prompts, args.prompt_len)).astype(np.int32)


# ----------------------------------------------------------------------------------------------
# ours


def lora_config(args) -> lora_lib.LoraConfig:
    """Our LoRA of `--lora_rank` / `--lora_alpha` on `lora.DEFAULT_TARGETS` (as PEFT's)."""
    return lora_lib.LoraConfig(rank=args.lora_rank, alpha=args.lora_alpha,
                               targets=lora_lib.DEFAULT_TARGETS)


def ours_steps(args, model: llama.Llama, prompts: np.ndarray, algo: str, *,
               prompt_group: int, old_logprobs: str, lora: bool = False) -> dict:
    """Time `args.steps` steps of our `algo` after `args.warmup`: {phase: [seconds]}, plus
    "trainable" (the parameters the optimizer updates: the adapters alone with `lora`)."""
    vocab = model.config.vocab_size
    g = args.group
    common = dict(learning_rate=args.lr, kl_coef=args.beta, kl_estimator="k3",
                  clip_eps=args.clip, ppo_epochs=1, num_minibatches=1, temperature=1.0,
                  top_k=0, top_p=1.0, stop_token_ids=(), prompt_group=prompt_group,
                  old_logprobs=old_logprobs)
    if algo == "grpo":
        cfg = grpo.GRPOConfig(group_size=g, **common)
        mod, value_mode = grpo, "none"
    else:
        cfg = ppo.PPOConfig(**common)
        mod, value_mode = ppo, "head"
    if lora:
        # The base weights are the frozen reference as they are (no copy); params = adapters.
        pdef, params, ref = policy_lib.init_policy(model, jax.random.PRNGKey(args.seed),
                                                   value_mode=value_mode, lora=lora_config(args))
    else:
        pdef, params, ref = policy_lib.init_policy(model, value_mode=value_mode)
    trainable = lora_lib.num_params(params)
    state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
    ids = jnp.asarray(np.repeat(prompts, g, axis=0))
    mask = jnp.ones(ids.shape, bool)
    sc = SamplingConfig(max_new_tokens=args.new, temperature=1.0, top_k=0, top_p=1.0,
                        stop_token_ids=(), prompt_group=prompt_group)
    score = jax.jit(lambda p, r, t, lp: policy_lib.score_batch(pdef, p, r, t, cfg,
                                                               rollout_logprobs=lp))
    update = mod.make_update(cfg, pdef)
    times = {"generation": [], "scoring": [], "update": [], "step": []}
    metrics = None
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        weights = policy_lib.policy_weights(pdef, state.params, state.ref_params)
        out = generate(nnx.merge(pdef.graphdef, weights), ids, mask, jax.random.key(i), sc)
        jax.block_until_ready(out.tokens)
        t1 = time.perf_counter()
        scores = reward_np(out.tokens, vocab)
        traj = buffer.make_trajectory(ids, mask, out.tokens, out.mask, scores=scores)
        lp, ref_lp, values = score(state.params, state.ref_params, traj, out.logprobs)
        traj = traj.replace(old_logprobs=lp, ref_logprobs=ref_lp, values=values)
        jax.block_until_ready(traj)
        t2 = time.perf_counter()
        state, metrics = update(state, traj)
        jax.block_until_ready(state.params)
        t3 = time.perf_counter()
        if i >= args.warmup:
            for k, v in (("generation", t1 - t0), ("scoring", t2 - t1), ("update", t3 - t2),
                         ("step", t3 - t0)):
                times[k].append(v)
    times["sanity"] = {"ratio": float(metrics["ratio"]), "loss": float(metrics["loss"]),
                       "skipped_steps": float(metrics["skipped_steps"])}
    times["trainable"] = trainable
    return times


# ----------------------------------------------------------------------------------------------
# TRL


def word_tokenizer(vocab: int):
    """A word-level tokenizer "t0" .. "t{V-1}" -> ids 0 .. V-1 (one word = one token), so a
    prompt of ids round-trips exactly through TRL's text interface."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(tokenizer_object=tok)
    # Set after construction: passed to the constructor, transformers 5 adds a BOS/EOS
    # post-processor that changes the ids.
    out.pad_token, out.eos_token = "t0", "t2"
    out.padding_side = "left"
    return out


def peft_config(args):
    """PEFT's LoRA of the same rank, alpha and target modules as ours (no dropout, no bias)."""
    from peft import LoraConfig

    return LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha,
                      target_modules=list(lora_lib.DEFAULT_TARGETS), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM")


def trl_steps(args, model: llama.Llama, prompts: np.ndarray, *, lora: bool = False) -> dict:
    """Time TRL GRPOTrainer steps: {phase: [seconds]}, plus "trainable" (parameters with
    requires_grad; with `lora`, PEFT's trainable count, checked against requires_grad)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(torch_threads(args))

    vocab = model.config.vocab_size
    tok = word_tokenizer(vocab)
    texts = [" ".join(f"t{i}" for i in row) for row in prompts]
    assert tok(texts[0])["input_ids"] == [int(i) for i in prompts[0]]
    data = Dataset.from_dict({"prompt": texts})

    def reward(prompts, completions, completion_ids, **kw):
        return [float(reward_np(np.asarray(c)[None], vocab)[0]) for c in completion_ids]

    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group, max_completion_length=args.new,
        generation_kwargs={"min_new_tokens": args.new}, learning_rate=args.lr, beta=args.beta,
        epsilon=args.clip, num_iterations=1, gradient_accumulation_steps=1, temperature=1.0,
        top_p=1.0, top_k=0, max_steps=args.warmup + args.steps, lr_scheduler_type="constant",
        warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0, gradient_checkpointing=False,
        use_cpu=True, bf16=False, fp16=False, logging_steps=10_000, save_strategy="no",
        report_to="none", disable_tqdm=True, seed=args.seed, shuffle_dataset=False,
        dataloader_num_workers=0, log_completions=False,
        model_init_kwargs={"dtype": torch.float32})
    # The checkpoint folder stays: TRL builds its reference model from the policy's
    # `name_or_path` (the Trainer puts the policy in train mode itself).
    hf = torch_model(model, tempfile.mkdtemp(prefix="rl_step_hf_"))
    # With a peft_config TRL wraps the model in a PeftModel (base frozen) and, for the KL
    # term, computes the reference log-probs with the adapter disabled: no second model.
    trainer = GRPOTrainer(model=hf, reward_funcs=[reward], args=cfg,
                          train_dataset=data, processing_class=tok,
                          peft_config=peft_config(args) if lora else None)
    grad = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    if lora:
        assert trainer.ref_model is None, "TRL + PEFT built a reference model"
        trainable, _ = trainer.model.get_nb_trainable_parameters()
        assert trainable == grad, f"PEFT trainable {trainable} != requires_grad {grad}"
    cur = {}
    times = {"generation": [], "scoring": [], "update": [], "step": []}

    def wrap(name, fn):
        def inner(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            cur[name] = cur.get(name, 0.0) + time.perf_counter() - t
            return out
        return inner

    trainer._generate = wrap("gen", trainer._generate)
    trainer._generate_and_score_completions = wrap("gas",
                                                   trainer._generate_and_score_completions)
    lengths = []
    trainer._calculate_rewards = (lambda f: lambda inputs, p, c, ids: (
        lengths.append(min(len(x) for x in ids)), f(inputs, p, c, ids))[1])(
        trainer._calculate_rewards)

    class Clock(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            cur.clear()
            cur["t0"] = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            step = time.perf_counter() - cur["t0"]
            if s.global_step > args.warmup:
                times["generation"].append(cur["gen"])
                times["scoring"].append(cur["gas"] - cur["gen"])
                times["update"].append(step - cur["gas"])
                times["step"].append(step)

    trainer.add_callback(Clock())
    trainer.train()
    assert min(lengths) == args.new, f"TRL responses shorter than {args.new}: {lengths}"
    times["threads"] = torch.get_num_threads()
    times["trainable"] = grad
    return times


# ----------------------------------------------------------------------------------------------


def med(x):
    return statistics.median(x)


def row(name, t):
    return (f"{name:34s} step {med(t['step']):6.2f} s = generation {med(t['generation']):5.2f}"
            f" + scoring {med(t['scoring']):5.2f} + update {med(t['update']):5.2f}"
            f"  (steps: {', '.join(f'{x:.2f}' for x in t['step'])})")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small_20m")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8, help="samples per prompt")
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch_threads", type=int, default=0,
                    help="torch.set_num_threads for TRL. 0 (default): as many threads as JAX "
                         "has cores (this process's CPU affinity), so both sides get the same "
                         "cores. A smaller count handicaps TRL; the printout and the result "
                         "file say so")
    ap.add_argument("--skip_trl", action="store_true")
    ap.add_argument("--skip_ppo", action="store_true")
    ap.add_argument("--ablate", action="store_true",
                    help="also time ours without prompt sharing and with re-scoring")
    ap.add_argument("--lora", action="store_true",
                    help="also time a LoRA step: ours GRPO without prompt sharing, adapters "
                         "only, against TRL's GRPOTrainer with a PEFT LoRA of the same rank, "
                         "alpha and targets")
    ap.add_argument("--lora_rank", type=int, default=8)
    ap.add_argument("--lora_alpha", type=float, default=16.0)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    return ap


def torch_threads(args) -> int:
    """TRL's torch threads: `--torch_threads`, or 0 -> as many as JAX has cores."""
    return resolve_threads(args.torch_threads)


# (result key, printed name, algorithm, prompt_group of `--group` (True) or none, old log-probs)
ROWS = (("ours_grpo", "ours GRPO, prompt sharing", "grpo", True, "auto"),
        ("ours_grpo_unshared", "ours GRPO, no prompt sharing", "grpo", False, "auto"))
PPO_ROWS = (("ours_ppo", "ours PPO, prompt sharing", "ppo", True, "auto"),
            ("ours_ppo_unshared", "ours PPO, no prompt sharing", "ppo", False, "auto"))
ABLATE_ROWS = (("ours_grpo_unshared_rescored", "ours GRPO, no sharing, re-scored", "grpo",
                False, "rescore"),)
# LoRA: unshared only (TRL does not share prompts; the social loop cannot). Appended to the
# spec: lora True.
LORA_ROWS = (("ours_grpo_lora", "ours GRPO LoRA, no prompt sharing", "grpo", False, "auto",
              True),)


def main(argv=None):
    args = build_parser().parse_args(argv)
    threads = torch_threads(args)
    handicap = None if args.skip_trl else thread_handicap(threads)

    cfg = llama.preset(args.preset, dtype="float32", param_dtype="float32")
    model = llama.Llama(cfg, rngs=nnx.Rngs(args.seed))
    prompts = make_prompts(args, cfg.vocab_size)
    print(f"model {args.preset}: {cfg.num_params() / 1e6:.1f}M params, float32, backend "
          f"{jax.default_backend()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {args.prompts} prompts x "
          f"{args.group} samples x ({args.prompt_len} prompt + {args.new} new tokens); lr "
          f"{args.lr}, beta {args.beta} (k3), clip {args.clip}; median of {args.steps} steps "
          f"after {args.warmup} warm-up; TRL: {threads} torch threads")
    if handicap:
        print(handicap, flush=True)

    def run(spec):
        key, name, algo, share, old, *lora = spec
        t = ours_steps(args, model, prompts, algo, prompt_group=args.group if share else 0,
                       old_logprobs=old, lora=bool(lora and lora[0]))
        print(row(name, t), flush=True)
        return t

    res = {}
    grpo_rows = ROWS + (ABLATE_ROWS if args.ablate else ())
    lora_rows = LORA_ROWS if args.lora else ()
    for spec in grpo_rows + lora_rows:
        res[spec[0]] = run(spec)
    if not args.skip_ppo:
        for spec in PPO_ROWS:
            res[spec[0]] = run(spec)
    trl = trl_lora = float("nan")
    if not args.skip_trl:
        res["trl_grpo"] = trl_steps(args, model, prompts)
        print(row(f"TRL GRPOTrainer ({res['trl_grpo']['threads']} torch threads)",
                  res["trl_grpo"]), flush=True)
        trl = med(res["trl_grpo"]["step"])
        if args.lora:
            res["trl_grpo_lora"] = trl_steps(args, model, prompts, lora=True)
            print(row(f"TRL GRPOTrainer + PEFT LoRA ({res['trl_grpo_lora']['threads']} torch "
                      "threads)", res["trl_grpo_lora"]), flush=True)
            trl_lora = med(res["trl_grpo_lora"]["step"])
        # Load drifts on a shared machine: time our GRPO rows again after TRL, pool both runs.
        for spec in grpo_rows + lora_rows:
            key, name = spec[:2]
            after = run((key, name + " (again, after TRL)") + spec[2:])
            for k in ("generation", "scoring", "update", "step"):
                res[key][k] = res[key][k] + after[k]
            print(row(name + " (both runs pooled)", res[key]), flush=True)
    ratios = {}
    for key, name, *_ in grpo_rows + (() if args.skip_ppo else PPO_ROWS):
        ratios[key] = trl / med(res[key]["step"])
        print(f"TRL GRPO step / {name} step = {ratios[key]:.2f}"
              + (" (no PPOTrainer in trl 1.16.0: TRL's GRPO is the nearest peer)"
                 if key.startswith("ours_ppo") else ""))
    print(f"sanity: ours GRPO first ratio {res['ours_grpo']['sanity']}")
    lora_figures = {}
    if args.lora:
        ours_lora = med(res["ours_grpo_lora"]["step"])
        ours_n = res["ours_grpo_lora"]["trainable"]
        trl_n = None if args.skip_trl else res["trl_grpo_lora"]["trainable"]
        print(f"sanity: ours GRPO LoRA first ratio {res['ours_grpo_lora']['sanity']}; trainable "
              f"parameters: ours {ours_n}, TRL + PEFT {trl_n} (rank {args.lora_rank}, alpha "
              f"{args.lora_alpha:g}, {', '.join(lora_lib.DEFAULT_TARGETS)}; the model has "
              f"{cfg.num_params()})")
        if trl_n is not None and ours_n != trl_n:
            raise SystemExit(f"LoRA rows train different parameter counts: ours {ours_n}, "
                             f"TRL + PEFT {trl_n}")
        ratios["ours_grpo_lora"] = trl_lora / ours_lora
        print(f"TRL GRPO + PEFT LoRA step / ours GRPO LoRA step = {ratios['ours_grpo_lora']:.2f}")
        lora_figures = {"ours_lora_step_s": ours_lora, "trl_lora_step_s": trl_lora,
                        "ratio_lora": trl_lora / ours_lora, "lora_rank": args.lora_rank,
                        "lora_alpha": args.lora_alpha,
                        "lora_targets": list(lora_lib.DEFAULT_TARGETS),
                        "ours_lora_trainable": ours_n, "trl_lora_trainable": trl_n}
    summary = {k: {p: (med(v) if isinstance(v, list) else v) for p, v in t.items()}
               for k, t in res.items()}
    print(json.dumps(summary))
    ours, unshared = med(res["ours_grpo"]["step"]), med(res["ours_grpo_unshared"]["step"])
    print(f"ours_step_s={ours:.3f} trl_step_s={trl:.3f} ratio={trl / ours:.2f} "
          f"ours_unshared_step_s={unshared:.3f} ratio_unshared={trl / unshared:.2f}"
          + (f" ours_lora_step_s={lora_figures['ours_lora_step_s']:.3f} trl_lora_step_s="
             f"{trl_lora:.3f} ratio_lora={lora_figures['ratio_lora']:.2f}" if args.lora else ""))
    figures = {"ours_step_s": ours, "trl_step_s": trl, "ratio": trl / ours,
               "ours_unshared_step_s": unshared, "ratio_unshared": trl / unshared,
               "ratios_to_trl": ratios, "torch_threads": None if args.skip_trl else threads,
               "handicap": handicap, "rows": summary, **lora_figures}
    finish("rl_step", figures, record=not args.no_record,
           argv=None if argv is None else ["benchmarks/rl_step.py", *argv])


if __name__ == "__main__":
    main()
