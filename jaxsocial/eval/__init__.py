"""jaxsocial.eval: checkpoint evaluation (see docs/eval.md).

- `sandbox`: contained execution of model-written programs (`sandbox.run`, `sandbox.run_many`).
- `code_metrics`: pass@1 / unbiased pass@k through the sandbox, for lm-eval code tasks.
- `lm_eval_model`: `@register_model("jaxsocial")`, our Llama + generation engine in lm-eval
  (needs the `eval` extra).
- `offline_tasks`: lm-eval's own task YAMLs pointed at local data (`tasks/*.yaml` templates).
- `alpaca`: AlpacaEval-style pairwise judging, raw and length-controlled win rates.

Submodules are imported on demand so that the sandbox works without lm-eval installed.
"""
