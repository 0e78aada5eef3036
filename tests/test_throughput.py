"""The rollout-throughput profiler (`launch/throughput.py`) on the demo's smoke config: it
calls the AOT-compiled programs with the loop's frozen inputs (grammar, encoder weights) and
reports positive figures."""
import jax
import pytest
from conftest import load_config_file, load_launcher


@pytest.mark.slow
def test_profile_runs_the_compiled_programs():
    throughput = load_launcher("launch/throughput.py")
    c = load_config_file("configs/demo.py", "smoke")
    res = throughput.profile(c, repeats=1)
    for k in ("setup_s", "compile_rollout_s", "compile_update_s", "rollout_s", "update_s",
              "tokens_per_s", "ticks_per_s", "trajectories_per_s", "ppo_tokens_per_s"):
        assert res[k] > 0, (k, res[k])
    assert res["config"] == c.name and res["devices"] == jax.device_count()


def test_bound_passes_the_frozen_inputs():
    """`_bound` forwards a `BindFrozen` wrapper's keywords and an update's grammar; a plain
    function's compiled program is returned as it is (negative control: without the frozen
    keywords the call would miss them)."""
    throughput = load_launcher("launch/throughput.py")
    from jaxsocial.train.run import BindFrozen

    seen = {}

    def compiled(*args, **kw):
        seen.update(args=args, kw=kw)
        return "ran"

    wrapped = BindFrozen(lambda *a, **k: None, grammar="G", encoder="E")
    assert throughput._bound(wrapped, compiled)(1, 2) == "ran"
    assert seen == {"args": (1, 2), "kw": {"grammar": "G", "encoder": "E"}}

    class Update:
        _jitted, grammar = object(), "G"

    throughput._bound(Update(), compiled)(3)
    assert seen == {"args": (3, "G"), "kw": {}}
    assert throughput._bound(lambda: None, compiled) is compiled
