r"""Social-RL training: agents act in the society, likes become reward, PPO/GRPO updates them.

    python launch/train.py --config=configs/demo.py --workdir=runs/demo
    python launch/train.py --config=configs/general.py --config.model.checkpoint=/path/llama3-8b
    python launch/train.py --config=configs/demo.py --config.rl.lr=1e-4 --config.train.epochs=3

The workdir receives metrics.jsonl (one object per epoch), TensorBoard events, samples.jsonl,
orbax checkpoints (every `train.checkpoint_every` epochs and at the end; the last
`train.keep_checkpoints` kept), summary.json and the final policy as a Hugging Face directory
(export/). Re-running with the same workdir resumes from its latest checkpoint (the resumed run
produces the same metrics as an uninterrupted one); `--noresume` starts over. SIGTERM saves a
checkpoint at the end of the current epoch and exits 0.
"""

import os
import sys

# launch/ holds profile.py, which would shadow the stdlib `profile` that cProfile imports:
# keep launch/ off the import path and put the repository root on it.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import json  # noqa: E402

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py",
                                          "Path to a config file (configs/*.py[:variant]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default runs/<config.name>).")
_RESUME = flags.DEFINE_bool("resume", True, "Resume from the workdir's latest checkpoint.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")


def main(argv):
    del argv
    from jaxsocial.train import runner
    config = _CONFIG.value
    workdir = _WORKDIR.value or os.path.join("runs", config.name)
    try:
        summary = runner.train(config, workdir, resume=_RESUME.value, progress=_PROGRESS.value)
    except (ValueError, FileNotFoundError) as e:  # bad config / missing checkpoint: one line
        sys.exit(f"error: {e}")
    print(runner.format_summary(summary))
    print(json.dumps({"workdir": workdir, "epochs": summary["epochs"]}))


if __name__ == "__main__":
    app.run(main)
