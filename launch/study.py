r"""Seeds x arms of a training config, one table with statistics (every learning figure of the
docs is made this way).

    python launch/study.py --config=configs/smol.py --seeds=3 --control --workdir=runs/study
    python launch/study.py --config=configs/demo.py --seeds=3 --control \
        --arm=zero:reward.non_post_mode=constant \
        --arm=skip:reward.non_post_mode=skip,rl.kl_per=sequence \
        --workdir=runs/ablation --config.train.epochs=6

Arms: "trained" (the config as given) unless `--arm=NAME:key=value[,key=value...]` flags name
them (`NAME:` alone is the config as given); the keys are `--config.` keys and the values are
parsed as train.py parses `--config.key=value` (a tuple: `key=('a', 'b')`, or the key
repeated). `--control` adds the arm "control", the base config with `rl.learning_rate=0` (a frozen
policy); an arm named "control" is the control arm the others are compared with either way.
`--config.KEY=VALUE` flags apply to every arm (an arm's own value for the same key wins);
the study sets `seed` itself.

Every (arm, seed) is one run of

    python launch/train.py --config=PATH[:variant] --workdir=W/ARM-seedS [--config. flags]
        --config.seed=S --noprogress

(seeds S = seed_start .. seed_start + seeds - 1), its console appended to W/ARM-seedS.log
after a line `=== start DATE (launch/study.py pid N) ===` (a log is never truncated: earlier
attempts stay above), at most `--parallel` at a time. Every config is loaded and checked before
anything runs: bad input is one line, `error: ...`, exit status 1. Rerunning the same command
resumes: a finished run (all epochs in metrics.jsonl, summary.json, the same config.json) is
skipped, any other is started again and train.py resumes it from its checkpoint (one that
holds no checkpoint yet starts over: `--noresume`). A failed run
is named with its log after the others finish, no table is written, and the exit status is 1.

One study per directory: the study holds an exclusive lock on W/study.lock for its whole life
(`jaxsocial.train.workdir_lock`; the kernel drops it when the process dies, kill -9 included),
and a second study on W exits 1 in one line, `error: workdir W is in use by pid P on host H
(started T) ...`, before it changes anything. A run whose workdir a live train.py holds (its
run.lock: a run started by hand, or one still checkpointing after its study was killed) is not
started and its log is left alone: it is named `busy` with the holder, and counts as failed.
SIGINT / SIGTERM stop launching and are passed on to the live runs, which checkpoint and exit
(rerun to resume); each run is its own session, so a terminal's Ctrl-C reaches it once, through
the study. The runs die with the study: on Linux the kernel sends each one SIGTERM when the
study dies, kill -9 included (prctl PR_SET_PDEATHSIG), so they checkpoint and exit rather than
train on unsupervised. Elsewhere a study killed by SIGKILL leaves its runs going: stop them by
the pids its `start` lines name before rerunning.

Written to W: study.json (everything: config, overrides, arms, seeds, each run's first / last
third and change per metric and the seconds its epochs took, per-arm statistics, comparisons
with the control, criteria, the command, `--parallel`, the date, the git commit), study.md (the
table: `jaxsocial.study.markdown`; in tool_call and free mode also the parse failures by kind
per epoch, `jaxsocial.study.failures_markdown`) and study.png (per-epoch curves of every arm;
needs matplotlib: pip install -e '.[notebook]').
"""

import dataclasses
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from absl import app, flags

from jaxsocial import cli, study
from jaxsocial.train import report_page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "launch", "train.py")
TRAINED = "trained"
LOCK_NAME = "study.lock"  # in the study directory, held by the study for its whole life
LOG_HEADER = "=== start "  # each attempt's first line in a run's log
# Linux: a study's runs get SIGTERM when it dies (see spawn); elsewhere there is no such signal.
PARENT_DEATH = sys.platform.startswith("linux")

_CONFIG = flags.DEFINE_string("config", None, "Config file (configs/*.py[:variant]) of every "
                              "arm; --config.KEY=VALUE flags apply to every arm.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory: one workdir per run "
                               "(ARM-seedS/), its log (ARM-seedS.log), study.json/md/png.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds per arm.")
_SEED_START = flags.DEFINE_integer("seed_start", 0, "First seed.")
_CONTROL = flags.DEFINE_bool("control", False, "Add the arm 'control': the base config with "
                             "rl.learning_rate=0 (a frozen policy).")
_ARMS = flags.DEFINE_multi_string("arm", [], "NAME:key=value[,key=value...]: an arm of "
                                  "config overrides (repeatable; default: one arm 'trained').")
_PARALLEL = flags.DEFINE_integer("parallel", 2, "Runs at a time.")
_COHORTS = flags.DEFINE_bool("cohorts", False, "A study of a config with agents.cohorts: each "
                             "cohort is a column of the table (with its share of the likes), "
                             "compared with the first frozen cohort (or the last cohort).")
_RECORD = flags.DEFINE_string("record", "", "NAME: also write study.json as a benchmark result, "
                              "benchmarks/results/NAME-<UTC>.json (command, commit, date, "
                              "machine; benchmarks/results/README.md), so docs can quote it.")

# The command line as typed, and its --config.KEY=VALUE flags (not absl flags of this script:
# they are parsed per arm by train.py's config parser, see load_config).
_ARGV: List[str] = []
_OVERRIDES: List[str] = []
_OVERRIDE = re.compile(r"^--?(no)?config\.([^=]+)(=.*)?$", re.S)


def split_overrides(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(the other arguments, the --config.KEY=VALUE flags as `--config.KEY=VALUE` or
    `--[no]config.KEY`); `--config.KEY VALUE` becomes `--config.KEY=VALUE`."""
    rest, overrides = [], []
    i = 0
    while i < len(argv):
        m = _OVERRIDE.match(argv[i])
        if not m:
            rest.append(argv[i])
        elif m.group(3) is None and not m.group(1) and i + 1 < len(argv) \
                and not argv[i + 1].startswith("-"):
            overrides.append(f"--config.{m.group(2)}={argv[i + 1]}")
            i += 1
        else:
            overrides.append("--" + argv[i].lstrip("-"))
        i += 1
    return rest, overrides


def override_key(flag: str) -> str:
    """`--config.a.b=1` / `--noconfig.a.b` -> "a.b"."""
    return _OVERRIDE.match(flag).group(2)


def parse_flags(argv):
    """cli.parse_flags on the arguments other than --config.KEY=VALUE (kept in _OVERRIDES)."""
    _ARGV[:] = argv
    rest, _OVERRIDES[:] = split_overrides(argv)
    return cli.parse_flags(rest)


def _one_line(text, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def load_config(config_arg: str, overrides: Sequence[str]):
    """The ConfigDict that `train.py --config=config_arg *overrides` trains (ml_collections'
    config flags, as train.py parses them). Raises ValueError in one line."""
    from ml_collections import config_flags
    path = config_arg.split(":", 1)[0]
    if not os.path.isfile(path):
        raise ValueError(f"--config={config_arg}: no such config file")
    argv = ["study", f"--config={config_arg}", *overrides]
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, flag_values=values,
                                             sys_argv=argv, lock_config=True)
    try:
        values(argv)
        config = holder.value
        config.get("seed")  # a config that failed to load raises on first use
    except (AttributeError, KeyError) as e:  # an override of a key the config lacks
        name = str(e.args[0] if e.args else e).strip("'\"")
        culprit = [o for o in overrides if name in override_key(o).split(".")]
        if not culprit:
            raise ValueError(_one_line(f"--config={config_arg}: {type(e).__name__}: {e}")) \
                from None
        raise ValueError(f"{culprit[0]}: {name!r} is not a key of this config (see {path} or "
                         f"jaxsocial/train/config.py)") from None
    except Exception as e:  # noqa: BLE001 -- flag values and config files fail in many ways
        text = str(e).strip()
        if "Traceback" in text:  # an exception inside get_config: its last line says it
            text = f"--config={config_arg}: {text.splitlines()[-1]}"
        raise ValueError(_one_line(text)) from None
    return config


@dataclasses.dataclass
class Run:
    """One train.py run of a study."""
    arm: str
    seed: int
    workdir: str
    argv: List[str]
    config: object  # the ConfigDict train.py will build from argv

    @property
    def name(self) -> str:
        return f"{self.arm}-seed{self.seed}"

    @property
    def log(self) -> str:
        return self.workdir + ".log"

    @property
    def epochs(self) -> int:
        return int(self.config.train.epochs)


def parse_arms(specs: Sequence[str], control: bool) -> Dict[str, List[Tuple[str, str]]]:
    """{arm: [(key, value), ...]} of the --arm flags ("trained" without any), plus "control"
    (rl.learning_rate=0) with --control. Raises ValueError: a malformed spec, a repeated name, an
    arm named "control" beside --control, an arm that sets `seed`."""
    arms: Dict[str, List[Tuple[str, str]]] = {}
    for spec in specs:
        name, pairs = study.parse_arm(spec)
        if name in arms:
            raise ValueError(f"--arm={spec!r}: arm {name!r} is given twice")
        if control and name == study.CONTROL:
            raise ValueError(f"--arm={spec!r}: the arm name {study.CONTROL!r} is taken by "
                             f"--control (rename the arm or drop --control)")
        if any(key == "seed" for key, _ in pairs):
            raise ValueError(f"--arm={spec!r}: seed is set by the study (--seeds, --seed_start)")
        arms[name] = pairs
    if not arms:
        arms[TRAINED] = []
    if control:
        arms[study.CONTROL] = [("rl.learning_rate", "0")]
    return arms


def arm_flags(common: Sequence[str], pairs: Sequence[Tuple[str, str]]) -> List[str]:
    """The --config. flags of one arm: the common ones, less those whose key the arm sets,
    then the arm's own."""
    own = {key for key, _ in pairs}
    return [o for o in common if override_key(o) not in own] + \
        [f"--config.{key}={value}" for key, value in pairs]


def plan(config_arg, common, arms, seeds, workdir) -> List[Run]:
    """Every (arm, seed) run, seed-major; each config loaded and checked (ValueError naming
    the arm)."""
    from jaxsocial.train import checks
    runs = []
    for seed in seeds:
        for arm, pairs in arms.items():
            overrides = arm_flags(common, pairs) + [f"--config.seed={seed}"]
            try:
                config = load_config(config_arg, overrides)
                checks.check(config)
            except ValueError as e:
                raise ValueError(f"arm {arm}: {e}") from None
            if arm == study.CONTROL and float(config.rl.learning_rate) != 0:
                raise ValueError(f"arm {arm}: rl.learning_rate={config.rl.learning_rate}, not "
                                 f"0 (a control arm trains nothing)")
            run_dir = os.path.join(workdir, f"{arm}-seed{seed}")
            argv = [f"--config={config_arg}", f"--workdir={run_dir}", *overrides,
                    "--noprogress"]
            runs.append(Run(arm, seed, run_dir, argv, config))
    return runs


def check_inputs(config_arg, overrides, arm_specs, control, seeds, seed_start, parallel,
                 workdir, cohorts=False) -> Tuple[Dict[str, List[Tuple[str, str]]], List[Run]]:
    """(arms, runs) of a study command; ValueError in one line for bad input (nothing is
    written or started)."""
    for flag, value, lo in (("seeds", seeds, 1), ("parallel", parallel, 1),
                            ("seed_start", seed_start, 0)):
        if value < lo:
            raise ValueError(f"--{flag}={value} must be >= {lo}")
    if not workdir:
        raise ValueError("--workdir is required (the study's directory)")
    if not config_arg:
        raise ValueError("--config is required (configs/*.py[:variant])")
    if any(override_key(o) == "seed" for o in overrides):
        raise ValueError("--config.seed: the study sets seed itself (--seeds, --seed_start)")
    arms = parse_arms(arm_specs, control)
    config = load_config(config_arg, overrides)  # the common flags, named without an arm
    if cohorts and not config.agents.get("cohorts", ()):
        raise ValueError(f"--cohorts: {config_arg} has no agents.cohorts")
    seed_list = list(range(seed_start, seed_start + seeds))
    return arms, plan(config_arg, overrides, arms, seed_list, workdir)


def complete(run: Run) -> bool:
    """The run's metrics.jsonl starts with epochs 1..train.epochs and summary.json exists."""
    records = study.read_metrics(os.path.join(run.workdir, "metrics.jsonl"))
    return (os.path.exists(os.path.join(run.workdir, "summary.json"))
            and [r["epoch"] for r in records[:run.epochs]] == list(range(1, run.epochs + 1)))


def finished(run: Run) -> bool:
    """Complete, and trained with exactly this config (config.json): nothing to launch."""
    from jaxsocial.train import config as run_config
    path = os.path.join(run.workdir, "config.json")
    if not (complete(run) and os.path.exists(path)):
        return False
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    safe, unsafe = run_config.resume_differences(stored, run.config)
    return not safe and not unsafe


def _has_checkpoint(workdir: str) -> bool:
    """Whether the run's workdir holds a checkpoint (train.py resumes from it)."""
    path = os.path.join(workdir, "checkpoints")
    return os.path.isdir(path) and any(name.isdigit() for name in os.listdir(path))


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes}m{s:02d}s" if minutes else f"{s}s"


# The child of spawn(parent_death=True) runs this, then execs the command (same pid): it asks
# the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG, 1; kept across exec), then
# checks that the parent it was given is still its parent, since one that died before the prctl
# took effect sends nothing. argv: the parent's pid, then the command.
_PARENT_DEATH_EXEC = r"""
import ctypes, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C passed on before the exec: just end
parent, argv = int(sys.argv[1]), sys.argv[2:]
if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:
    sys.stderr.write(f"warning: prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()}): "
                     f"this run outlives launch/study.py (pid {parent}) if that is killed\n")
if os.getppid() != parent:
    sys.stderr.write(f"error: launch/study.py (pid {parent}) ended before this run began: "
                     f"not started\n")
    sys.exit(1)
sys.stderr.flush()
os.execvp(argv[0], argv)
"""


def spawn(argv: Sequence[str], log, parent_death: bool = PARENT_DEATH) -> subprocess.Popen:
    """Start the command `argv` with its stdout and stderr to the open file `log`, in a session
    of its own (a terminal's Ctrl-C reaches it once, passed on by Launcher, not twice).

    parent_death (Linux only): the kernel sends it SIGTERM when this process dies, kill -9
    included, through a small Python step that sets PR_SET_PDEATHSIG and then execs argv (so
    the Popen's pid is the command's). The signal follows the thread that started the child:
    call this from a thread that lives as long as the process (the main thread does)."""
    argv = [str(a) for a in argv]
    if parent_death:
        argv = [sys.executable, "-c", _PARENT_DEATH_EXEC, str(os.getpid()), *argv]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


class Launcher:
    """Runs train.py subprocesses, at most `parallel` at a time. SIGINT / SIGTERM stop
    launching and are passed on to the live runs (each its own session, so a Ctrl-C reaches
    them once, through this process); they get SIGTERM if this process dies (`spawn`). A run
    whose workdir a live process holds (run.lock) is not started and its log is not touched:
    `busy` maps its name to the one-line reason naming the holder."""

    def __init__(self, parallel: int, out=sys.stdout):
        self.parallel, self.out = parallel, out
        self.live: Dict[str, Tuple[Run, subprocess.Popen, float]] = {}
        self.busy: Dict[str, str] = {}
        self.stopped = None

    def say(self, text: str):
        self.out.write(text + "\n")
        self.out.flush()

    def _on_signal(self, signum, frame):  # noqa: ARG002
        self.stopped = signal.Signals(signum).name
        for _, proc, _ in self.live.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    def _start(self, run: Run):
        from jaxsocial.train import workdir_lock
        try:  # a live run's log is its own: not even the header below goes into it
            workdir_lock.check_free(run.workdir)
        except workdir_lock.WorkdirBusy as e:
            self.busy[run.name] = _one_line(e)
            self.say(f"busy {run.name}: {_one_line(e)} (not started, its log left alone)")
            return
        os.makedirs(os.path.dirname(os.path.abspath(run.log)), exist_ok=True)
        # Appended, never truncated: should a run start on this workdir between the check above
        # and train.py's own lock, its log keeps everything it wrote.
        with open(run.log, "a", encoding="utf-8") as log:
            now = datetime.datetime.now().astimezone().isoformat("T", "seconds")
            log.write(f"{LOG_HEADER}{now} (launch/study.py pid {os.getpid()}) ===\n")
            log.flush()
            # A run stopped before its first checkpoint cannot resume, and train.py refuses to
            # cut its logged epochs unasked: a study's own run starts over.
            fresh = [] if _has_checkpoint(run.workdir) else ["--noresume"]
            proc = spawn([sys.executable, TRAIN, *run.argv, *fresh], log)
        self.live[run.name] = (run, proc, time.monotonic())
        self.say(f"start {run.name} (pid {proc.pid}, log: {run.log})")

    def _reap(self, rcs: Dict[str, int]):
        for name, (run, proc, t0) in list(self.live.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.live[name]
            rcs[name] = rc
            state = "done" if rc == 0 else f"FAILED (exit {rc})"
            self.say(f"{state} {name} in {_duration(time.monotonic() - t0)}")

    def run(self, runs: Sequence[Run]) -> Dict[str, int]:
        """{run name: exit status} of the runs that were started."""
        pending, rcs = list(runs), {}
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT,
                                                                    signal.SIGTERM)}
        try:
            while self.live or (pending and not self.stopped):
                while pending and not self.stopped and len(self.live) < self.parallel:
                    self._start(pending.pop(0))
                time.sleep(0.2)
                self._reap(rcs)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
        return rcs


def last_error(log: str) -> str:
    """The last `error:` line of the last attempt in a run's log ('' if none)."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = []
            for line in f:
                if line.startswith(LOG_HEADER):
                    lines = []
                elif line.startswith("error:"):
                    lines.append(line.strip())
    except OSError:
        return ""
    return lines[-1] if lines else ""


def report_problems(runs: Sequence[Run], rcs: Dict[str, int], say,
                    busy: Optional[Dict[str, str]] = None) -> int:
    """Name every failed, incomplete or busy (not started: `Launcher.busy`) run with its log;
    their number."""
    bad = 0
    for run in runs:
        if busy and run.name in busy:
            bad += 1
            say(f"failed: {run.name} (not started: {busy[run.name]}) (log: {run.log})")
            continue
        rc = rcs.get(run.name, 0)
        if rc == 0 and complete(run):
            continue
        bad += 1
        why = f"exit {rc}" if rc else f"not all {run.epochs} epochs in metrics.jsonl"
        err = last_error(run.log)
        say(f"failed: {run.name} ({why}){': ' + err if err else ''} (log: {run.log})")
    return bad


def git_state() -> Dict[str, object]:
    """{"commit", "dirty"} of the checkout this script is in (None where git cannot tell)."""
    def git(*args):
        try:
            return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                                  timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def study_record(result, arms, runs, common, config_arg, command, epoch_seconds=None,
                 parallel=None) -> dict:
    """study.json: the inputs, every run (with its train.py command and, where its metrics
    carry them, the seconds its epochs took: `epochs_s`, set-up not included; runs sharing the
    machine, `parallel` at a time, each take longer) and the statistics."""
    by_run = {(r.arm, r.seed): r for r in runs}
    epoch_seconds = epoch_seconds or {}

    def run_arm(column):  # a cohort study's columns are "cohort" or "arm/cohort"
        if column in arms:
            return column
        return column.split("/", 1)[0] if "/" in column else next(iter(arms))
    per_run = {col: {str(seed): dict(summary, epochs_s=epoch_seconds.get((run_arm(col), seed)),
                                     workdir=by_run[run_arm(col), seed].workdir,
                                     log=by_run[run_arm(col), seed].log,
                                     train_command=shlex.join([
                                         "python", "launch/train.py",
                                         *by_run[run_arm(col), seed].argv]))
                     for seed, summary in by_seed.items()}
               for col, by_seed in result["runs"].items()}
    return cli.json_safe({
        "command": command, "date": datetime.datetime.now().astimezone().isoformat(),
        "git": git_state(), "config": config_arg, "overrides": list(common),
        "arms": {a: [f"{k}={v}" for k, v in p] for a, p in arms.items()},
        "control": result["control"], "seeds": sorted({r.seed for r in runs}),
        "parallel": parallel,
        "level": result["level"], "metrics": list(result["metrics"]), "runs": per_run,
        "stats": result["stats"], "comparisons": result["comparisons"],
        "criteria": result["criteria"]})


def _epoch_seconds(records) -> Optional[float]:
    """The summed `wall_s` of a run's epochs (None where any epoch lacks it)."""
    walls = [r.get("wall_s") for r in records]
    if not walls or any(not isinstance(w, (int, float)) for w in walls):
        return None
    return round(float(sum(walls)), 1)


def frozen_cohort(config_arg, common) -> Optional[str]:
    """A cohort study's base of comparison: the config's first frozen cohort, or without one its
    last cohort (e.g. `likes - comments`)."""
    cohorts = [dict(c) for c in load_config(config_arg, common).agents.get("cohorts", ()) or ()]
    for cohort in cohorts:
        if not cohort.get("trainable", True):
            return str(cohort["name"])
    return str(cohorts[-1]["name"]) if cohorts else None


def write_outputs(workdir, arms, runs, common, config_arg, say, parallel=None, cohorts=False):
    """Read every run's metrics, write study.json / study.md / study.png, print the table.
    cohorts: the columns are the runs' cohorts (`study.cohort_runs`)."""
    records = {arm: {} for arm in arms}
    seconds = {}
    for run in runs:
        found = study.read_metrics(os.path.join(run.workdir, "metrics.jsonl"))
        records[run.arm][run.seed] = found[:run.epochs]
        seconds[run.arm, run.seed] = _epoch_seconds(found[:run.epochs])
    if cohorts:
        result = study.analyze(study.cohort_runs(records),
                               control=frozen_cohort(config_arg, common),
                               metrics=study.COHORT_METRICS, pair_seeds=True)
    else:
        result = study.analyze(records, control=study.CONTROL)
    command = shlex.join(["python", *_ARGV]) if _ARGV else None
    text = study.markdown(result, command)
    fails = study.failures(records)  # tool_call / free mode: parse failures by kind
    if fails:
        text += "\n" + study.failures_markdown(fails)
    record = study_record(result, arms, runs, common, config_arg, command, seconds, parallel)
    if fails:
        record["failures"] = fails
    with open(os.path.join(workdir, "study.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(workdir, "study.md"), "w", encoding="utf-8") as f:
        f.write(text)
    say(text)
    wrote = ["study.md", "study.json"]
    if study.plot(result, os.path.join(workdir, "study.png")):
        wrote.append("study.png")
    else:
        say("no study.png: the plot needs matplotlib (pip install -e '.[notebook]')")
    report_page.write(workdir)
    wrote.append("report.html")
    say(f"wrote {os.path.join(workdir, '')}: {', '.join(wrote)}")
    return record


def check_record_name(name: str) -> None:
    """A `--record` NAME becomes a file name: letters, digits, '_' and '.' only."""
    if not re.fullmatch(r"[A-Za-z0-9_.]+", name):
        raise ValueError(f"--record={name!r}: letters, digits, '_' and '.' only")


def record_result(name: str, record: dict, argv=None, directory=None) -> str:
    """Write a study's record (study.json) as benchmarks/results/NAME-<UTC>.json through
    benchmarks/common.write_result: the command, commit, date and this machine beside it."""
    check_record_name(name)
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "jaxsocial_bench_common", os.path.join(ROOT, "benchmarks", "common.py"))
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    return common.write_result(name, record, argv=argv, directory=directory)


def main(argv):
    del argv
    from jaxsocial.train import workdir_lock
    try:
        arms, runs = check_inputs(_CONFIG.value, _OVERRIDES, _ARMS.value, _CONTROL.value,
                                  _SEEDS.value, _SEED_START.value, _PARALLEL.value,
                                  _WORKDIR.value, _COHORTS.value)
        if _RECORD.value:
            check_record_name(_RECORD.value)
        workdir_lock.prepare(_WORKDIR.value)
        # Held until this process exits (the kernel drops it then, kill -9 included); taken
        # before any run's state is read or any log opened.
        study_lock = workdir_lock.WorkdirLock(_WORKDIR.value, lock_name=LOCK_NAME, what="study")
        study_lock.acquire()
    except (ValueError, workdir_lock.WorkdirBusy) as e:
        sys.stderr.write(f"error: {_one_line(e)}\n")
        sys.exit(1)
    todo = [r for r in runs if not finished(r)]
    launcher = Launcher(_PARALLEL.value)
    launcher.say(f"study: {len(arms)} arm(s) x {len(runs) // len(arms)} seed(s) in "
                 f"{_WORKDIR.value}: {len(todo)} to run, {len(runs) - len(todo)} finished, "
                 f"{_PARALLEL.value} at a time")
    rcs = launcher.run(todo)
    if launcher.stopped:
        launcher.say(f"stopped by {launcher.stopped}: rerun the same command to resume")
        return
    if report_problems(runs, rcs, launcher.say, launcher.busy):
        launcher.say("no table written: rerun the same command once fixed (finished runs "
                     "are skipped)")
        sys.exit(1)
    record = write_outputs(_WORKDIR.value, arms, runs, _OVERRIDES, _CONFIG.value, launcher.say,
                           parallel=_PARALLEL.value, cohorts=_COHORTS.value)
    if _RECORD.value:
        path = record_result(_RECORD.value, record, argv=_ARGV or None)
        launcher.say(f"result: {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
