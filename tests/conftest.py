"""Every test sees 8 fake CPU devices; set before jax is imported anywhere."""
import os

import pytest

# The suite compiles far more than it runs: most tests build a small program once and run it
# for a few steps. At LLVM -O0, XLA's CPU backend compiles those programs about 30% faster and
# runs them about 2x slower, which on 2 cores takes minutes off `pytest` (docs/architecture.md,
# "Tests"). XLA's older elemental fusion emitters (`xla_cpu_use_fusion_emitters=false`) compile
# a demo epoch about 15% faster again (14.4 -> 12.3 s idle, 39-52 -> 33 s beside the suite).
# The HLO, and so what each test checks, is unchanged; only the machine code differs.
# A user's own XLA_FLAGS come after it, so they can override it.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = " ".join(
    [TEST_XLA_FLAGS, os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (compiling for a TPU topology, tests/test_preflight.py) takes a machine-wide lock file
# unless told that several processes may load it: pytest's workers each compile on their own.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One persistent compilation cache for the whole run (jaxsocial.compile_cache): pytest's
# controller names it before its workers start, so they, their launcher subprocesses and every
# later file load a program compiled once instead of compiling it again. Programs compiling in
# over 0.2 s get an entry (at -O0 most of the suite's do not reach JAX's default 1 s). A user's
# own JAXSOCIAL_COMPILE_CACHE (a directory kept across runs, or "off") wins.
_OWN_COMPILE_CACHE = "JAXSOCIAL_COMPILE_CACHE" not in os.environ
if _OWN_COMPILE_CACHE:
    import tempfile
    import uuid
    os.environ["JAXSOCIAL_COMPILE_CACHE"] = os.path.join(
        tempfile.gettempdir(), f"jaxsocial-pytest-xla-{os.getpid()}-{uuid.uuid4().hex[:8]}")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
from jaxsocial import compile_cache  # noqa: E402 -- after the environment it reads

compile_cache.enable()


def pytest_sessionfinish(session, exitstatus):
    """The controller removes the run's own compile cache (workers leave it to the controller)."""
    if _OWN_COMPILE_CACHE and not hasattr(session.config, "workerinput"):
        import shutil
        shutil.rmtree(os.environ["JAXSOCIAL_COMPILE_CACHE"], ignore_errors=True)

# The longest files (minutes on 2 cores), longest first. pytest-xdist's loadfile hands whole
# files to the workers in collection order (pytest.ini: --no-loadscope-reorder), so these start
# first and the many short files fill in at the end, rather than one long file running alone
# while the other worker idles. test_readme.py leads: its newcomer runs `configs/demo.py:smoke`
# in a one-device process first, so the later one-device launches of the same programs
# (test_train_loop's SIGINT run, test_preflight's launcher run, test_study's two arms) load
# them from the run's compile cache instead of compiling them at the same time.
LONGEST_FIRST = (
    "test_readme.py", "test_train_loop.py", "test_cohorts.py", "test_runs_resume.py",
    "test_families.py", "test_preflight.py", "test_fork.py", "test_fused_epoch.py",
    "test_loop_variants.py", "test_fit.py", "test_study.py", "test_interviews.py", "test_smol.py",
    "test_compile_cache.py", "test_dataset.py", "test_recsys_reddit.py", "test_gguf.py",
    "test_aot_memory.py", "test_report_page.py",
    "test_micro_batch.py", "test_text_grounding.py", "test_runs_errors.py", "test_throughput.py",
    "test_tool_call.py",
)


def pytest_collection_modifyitems(config, items):
    """Longest files first (`LONGEST_FIRST`); a stable sort keeps every file's own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test file (its module fixtures finalised): drop JAX's compiled programs,
    collect, and hand the freed heap back to the system (`fit.release_freed_memory`: glibc
    keeps it otherwise). A worker otherwise keeps every file's executables and grows to ~5 GiB,
    and two workers on a 2-core, 24 GiB machine came within reach of its memory by the end of
    the suite."""
    yield
    if nextitem is None or nextitem.path != item.path:
        import gc

        import jax

        from jaxsocial.train import fit

        jax.clear_caches()
        gc.collect()
        fit.release_freed_memory()


_LAUNCHER_FLAGS = set()


def load_launcher(relpath):
    """Import a `launch/*.py` script as a module (for calling its functions in a test).

    Launchers define absl flags at import time on the global FLAGS; the flags a previously
    loaded launcher defined are removed first, so one test session can load several.
    """
    import importlib.util

    from absl import flags

    for name in list(_LAUNCHER_FLAGS):
        if name in flags.FLAGS:
            delattr(flags.FLAGS, name)
    _LAUNCHER_FLAGS.clear()
    before = set(flags.FLAGS)
    module = "launcher_" + os.path.splitext(os.path.basename(relpath))[0]
    spec = importlib.util.spec_from_file_location(module, os.path.join(ROOT, relpath))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _LAUNCHER_FLAGS.update(set(flags.FLAGS) - before)
    return mod


# Subprocesses that test the console, signals or files (not sharding) run on one device, not the
# suite's 8 fake ones: an epoch over 8 fake devices costs ~10x one on 2 cores.
ONE_DEVICE_ENV = dict(os.environ, XLA_FLAGS=TEST_XLA_FLAGS)


def hold_lock_in_another_process(directory, **lock):
    """A live process holding `WorkdirLock(directory, **lock)`, as a running trainer (or, with
    lock_name="study.lock", a study) does; the caller kills it."""
    import json
    import subprocess
    import sys
    code = ("import json, sys, time\n"
            "from jaxsocial.train.workdir_lock import WorkdirLock\n"
            "WorkdirLock(sys.argv[1], **json.loads(sys.argv[2])).acquire()\n"
            "print('held', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(directory), json.dumps(lock)],
                            cwd=ROOT, env=ONE_DEVICE_ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def load_config_file(relpath, variant=None):
    """`get_config(variant)` of a config file (`configs/demo.py`), as `--config=path:variant`
    would build it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "cfg_" + os.path.splitext(os.path.basename(relpath))[0], os.path.join(ROOT, relpath))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(variant) if variant is not None else mod.get_config()


def jaxpr_shapes(fn, *args):
    """Shapes of every intermediate value in fn's jaxpr (sub-jaxprs included): to assert that
    a function never materialises some array, e.g. a users x posts matrix."""
    import jax

    shapes = []

    def walk(jpr):
        for eqn in jpr.eqns:
            shapes.extend(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return shapes


def assert_no_users_by_posts(params, users: int = 13):
    """`recsys.recommend` for `users` users under `params` (post_capacity other than users)
    never materialises a [users, posts] array, though both sizes do appear in its jaxpr."""
    import jax
    import jax.numpy as jnp

    from jaxsocial.social import recsys, society

    state = society.reset(jax.random.key(0), params)
    shapes = jaxpr_shapes(lambda k, s, u: recsys.recommend(k, s, u, params),
                          jax.random.key(0), state, jnp.arange(users, dtype=jnp.int32))
    posts = params.post_capacity
    assert any(posts in s for s in shapes) and any(users in s for s in shapes)
    assert not [s for s in shapes if users in s and posts in s]
