r"""Ask a trained society's LLM agents a question, outside the society.

    python launch/interview.py --workdir=runs/demo --question="What do your followers like?"
    python launch/interview.py --workdir=runs/demo --epoch=4 --question="..." --out=answers.jsonl
    python launch/interview.py --workdir=runs/demo --export=runs/demo/export --question="..."

The run's config comes from `workdir/config.json` and its state from the checkpoint of
`--epoch` (default: the newest). Every agent answers in its own context: its persona and the
feed the recommender would show it now, with the question in place of the action instruction,
decoded greedily by the policy (`train.host.interview`). Nothing is posted and nothing is saved
to the workdir. With `--export=DIR` the policy is that Hugging Face directory (e.g. a run's
export/ or initial/) in the society as the config starts it (the workdir's checkpoints are not
read). One JSON object per agent goes to stdout (and `--out`); bad input is one `error:` line,
exit 1. During training, `--config.agents.interviews='((4, "..."),)'` asks at epoch 4 and
writes interviews.jsonl.
"""

import json
import os
import sys
from typing import List

from absl import app, flags

from jaxsocial import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A launch/train.py workdir.")
_QUESTION = flags.DEFINE_string("question", None, "The question every agent answers.")
_EPOCH = flags.DEFINE_integer("epoch", None, "The checkpoint's epoch (default: the newest).")
_EXPORT = flags.DEFINE_string("export", "", "A Hugging Face directory to interview instead of "
                              "the workdir's checkpoints (in the config's initial society).")
_OUT = flags.DEFINE_string("out", "", "Also write the answers (JSON lines) here.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Longest answer, in tokens.")


def _tuples(x):
    """config.json's lists back to the tuples the configs hold."""
    if isinstance(x, dict):
        return {k: _tuples(v) for k, v in x.items()}
    if isinstance(x, list):
        return tuple(_tuples(v) for v in x)
    return x


def load_config(workdir: str):
    """The ConfigDict a workdir was trained with (workdir/config.json)."""
    import ml_collections
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise ValueError(f"--workdir={workdir}: no config.json (is it a launch/train.py "
                         f"workdir?)")
    with open(path, encoding="utf-8") as f:
        return ml_collections.ConfigDict(_tuples(json.load(f)))


def interview(workdir: str, question: str, epoch=None, export: str = "",
              max_new_tokens: int = 48) -> List[dict]:
    """The agents' answers (see the module docstring)."""
    from jaxsocial.train import checkpointing, host
    from jaxsocial.train import run as run_lib

    if not question or not question.strip():
        raise ValueError("--question must be non-empty")
    config = load_config(workdir)
    if export:
        if not os.path.isfile(os.path.join(export, "config.json")):
            raise ValueError(f"--export={export}: no config.json (a Hugging Face directory, "
                             f"e.g. a run's export/)")
        config.model.checkpoint = export
        config.rl.lora_rank = 0  # an export holds the merged weights
    run = run_lib.build_run(config)
    state = run.init_state()
    if not export:
        ckpt = checkpointing.Checkpointer(workdir, keep=1_000_000)  # read only
        try:
            steps = ckpt.all_steps()
            if not steps:
                raise ValueError(f"--workdir={workdir}: no checkpoint to interview")
            if epoch is not None and epoch not in steps:
                raise ValueError(f"--epoch={epoch}: no such checkpoint in {workdir} "
                                 f"(have {sorted(steps)})")
            restored, _, _ = ckpt.restore(state, epoch)
        except checkpointing.CheckpointError as e:
            raise ValueError(str(e)) from None
        finally:
            ckpt.close()
        state = run.place(restored)
    return host.interview(run.setup, state, question, max_new_tokens=max_new_tokens)


def main(argv: List[str]):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        if not _WORKDIR.value or _QUESTION.value is None:
            raise ValueError("--workdir and --question are required")
        answers = interview(_WORKDIR.value, _QUESTION.value, _EPOCH.value, _EXPORT.value,
                            _MAX_NEW.value)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {' '.join(str(e).split())}\n")
        sys.exit(1)
    text = "".join(json.dumps(a, ensure_ascii=False) + "\n" for a in answers)
    if _OUT.value:
        with open(_OUT.value, "w", encoding="utf-8") as f:
            f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
