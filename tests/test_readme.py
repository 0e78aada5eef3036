"""The README's newcomer commands, run as written: the README cannot drift from the code.

The block after the README's `<!-- tests/test_readme.py ... -->` marker is run line by line with
bash, from a scratch directory that links the repository's launch/, configs/ and notebooks/ (so
the relative paths resolve as in a checkout, and every file a command writes is visible). The
other `python launch/...` commands in the README and in docs/*.md (in ```bash blocks, or inline
in the README) are too long for CI; for those the script, the config file, its variant and every
`--config.*` override are checked to exist.
"""
import json
import os
import re
import shlex
import subprocess

import pytest
from conftest import ONE_DEVICE_ENV, ROOT, load_config_file

README = os.path.join(ROOT, "README.md")
MARKER = "<!-- tests/test_readme.py"
LINKED = ("launch", "configs", "notebooks")


def _bash_blocks(text):
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def _commands(block):
    return [line.strip() for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def newcomer_block():
    text = open(README, encoding="utf-8").read()
    at = text.find(MARKER)
    assert at >= 0, f"README.md lost its {MARKER} ...--> marker"
    blocks = _bash_blocks(text[at:])
    assert blocks, "no ```bash block after the marker"
    return _commands(blocks[0])


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory):
    """Runs the block; {command prefix: CompletedProcess}, the scratch dir, repo files before."""
    home = tmp_path_factory.mktemp("newcomer")
    for name in LINKED:
        os.symlink(os.path.join(ROOT, name), home / name)
    before = sorted(os.listdir(os.path.join(ROOT, "notebooks")))
    done = {}
    for cmd in newcomer_block():
        # bash resets $PWD to the scratch dir (the notebook resolves its workdir from it).
        env = {k: v for k, v in ONE_DEVICE_ENV.items() if k != "PWD"}
        proc = subprocess.run(["bash", "-c", cmd], cwd=home, env=env, capture_output=True,
                              text=True, timeout=900)
        done[cmd] = proc
        assert proc.returncode == 0, (cmd, (proc.stdout + proc.stderr)[-4000:])
    return done, home, before


def _run(newcomer, prefix):
    done, home, _ = newcomer
    hits = [p for c, p in done.items() if c.startswith(prefix)]
    assert len(hits) == 1, f"the README's newcomer block has no single line starting {prefix!r}"
    return hits[0], home


def test_demo_smoke_console_tells_the_story(newcomer):
    proc, home = _run(newcomer, "python launch/train.py --config=configs/demo.py:smoke")
    out = proc.stdout + proc.stderr
    low = out.lower()
    for noise in ("constant folding", "object at 0x", "checkpointmanager", "orbax", "libtpu"):
        assert noise not in low, (noise, out[-3000:])
    assert "likes/post=" in proc.stderr and "parse_fail=" in proc.stderr  # the progress bar
    assert len(out.splitlines()) < 30, out
    assert "likes/post by epoch:" in proc.stdout and "best post of epoch" in proc.stdout
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["epochs"] == 1
    workdir = last["workdir"]
    assert f"wrote {workdir}/" in proc.stdout
    log = (home / workdir / "train.log").read_text()
    assert "CheckpointManager" in log  # control: the full log went to the file
    for name in ("summary.json", "metrics.jsonl", "samples.jsonl", "tensorboard",
                 "export/config.json", "export/tokenizer.json", "initial/model.safetensors"):
        assert (home / workdir / name).exists(), name


def test_the_export_evaluates_against_the_initial_policy(newcomer):
    proc, home = _run(newcomer, "python launch/eval.py --checkpoint=")
    ckpt = re.search(r"--checkpoint=(\S+)", proc.args[2]).group(1)
    report = json.loads((home / os.path.dirname(ckpt) / "eval_export" / "results.json")
                        .read_text())
    rows = {r["benchmark"]: r for r in report["table"]}
    he = [r for name, r in rows.items() if name.lower().startswith("humaneval")]
    assert he and he[0]["base"] is not None and he[0]["trained"] is not None, report["table"]
    assert report["skipped"], report  # tasks without offline data, each with its reason
    assert report["flags"]["baseline"].endswith("initial")  # the run's initial policy, by default


def test_the_notebook_runs_headless_and_saves_its_png(newcomer):
    proc, home = _run(newcomer, "JAXSOCIAL_WORKDIR=")
    workdir = re.search(r"JAXSOCIAL_WORKDIR=(\S+)", proc.args[2]).group(1)
    png = home / workdir / "analysis.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    executed = json.loads((home / workdir / "analyze_run.ipynb").read_text())
    outputs = [o for c in executed["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert "avg_likes_per_post" in json.dumps(outputs)  # the summary table was printed


def test_simulate_and_tournament_write_their_workdirs(newcomer):
    for prefix in ("python launch/simulate.py", "python launch/tournament.py"):
        proc, home = _run(newcomer, prefix)
        workdir = re.search(r"--workdir=(\S+)", proc.args[2]).group(1)
        assert os.listdir(home / workdir), prefix


def test_nothing_is_written_outside_the_workdirs(newcomer):
    done, home, before = newcomer
    workdirs = {re.search(r"(?:--workdir=|JAXSOCIAL_WORKDIR=)(\S+)", c).group(1).split("/")[0]
                for c in done if re.search(r"--workdir=|JAXSOCIAL_WORKDIR=", c)}
    assert sorted(os.listdir(home)) == sorted(set(LINKED) | workdirs)
    assert sorted(os.listdir(os.path.join(ROOT, "notebooks"))) == before


def check_launch_command(cmd):
    """Asserts the script, the config file, its variant and every --config.* key exist."""
    args = shlex.split(cmd, comments=True)
    args = args[args.index("python") + 1:]
    assert os.path.exists(os.path.join(ROOT, args[0])), cmd
    cfg = None
    for a in args[1:]:
        if a.startswith("--config="):
            path, _, variant = a[len("--config="):].partition(":")
            cfg = load_config_file(path, variant or None)
        elif a.startswith("--config."):
            key = a[len("--config."):].split("=")[0]
            node = cfg
            for part in key.split("."):
                assert part in node, (cmd, key)
                node = node[part]


def launch_commands(text):
    """The `launch/` commands of a page: each ```bash block's lines (continuations joined, the
    block's `NAME="..."` variables substituted), and inline `python launch/...` spans."""
    cmds = []
    for block in _bash_blocks(text):
        vars_ = {}
        for cmd in _commands(re.sub(r"\s*\\\n\s*", " ", block)):
            if m := re.fullmatch(r'(\w+)="([^"]*)"', cmd):
                vars_[m.group(1)] = m.group(2)
                continue
            for name, value in vars_.items():
                cmd = re.sub(rf"\${name}\b", value, cmd)
            if "launch/" in cmd:
                cmds.append(cmd)
    return cmds + re.findall(r"`(python launch/[^`\n]*)`", text)


def test_every_launch_command_in_the_docs_names_real_scripts_configs_and_keys():
    docs = os.path.join(ROOT, "docs")
    pages = [README] + [os.path.join(docs, n) for n in sorted(os.listdir(docs))
                        if n.endswith(".md")]
    readme = launch_commands(open(README, encoding="utf-8").read())
    assert len(readme) >= 8, readme
    cmds = [c for p in pages for c in launch_commands(open(p, encoding="utf-8").read())]
    assert len(cmds) >= 30, cmds
    for cmd in cmds:
        check_launch_command(cmd)
    # The parsing: a continued line is one command, a block's variable is substituted.
    block = ('```bash\nC="--config=configs/demo.py"\n'
             'python launch/train.py $C \\\n  --workdir=w\n```')
    assert launch_commands(block) == ["python launch/train.py --config=configs/demo.py --workdir=w"]


@pytest.mark.parametrize("bad", [
    "python launch/train.py --config=configs/demo.py --config.rl.lrr=1e-4",  # misspelt key
    "python launch/train.py --config=configs/demo.py:smok",                  # unknown variant
    "python launch/trian.py --config=configs/demo.py",                       # no such script
])
def test_the_drift_check_rejects_a_broken_command(bad):
    with pytest.raises((AssertionError, ValueError)):
        check_launch_command(bad)
