"""Which rung items keep their trial and which continue one (driver.measurement.continuation):
the same repeat of the same configuration, eager trials of ranking rungs only."""

from amdahl.columns import TrialSettings
from amdahl.driver.measurement import continuation
from amdahl.spec.load import validate_spec

SEARCH = {"method": "halving", "min_steps": 10, "eta": 3, "final_repeats": 2}


def _spec(**overrides):
    base = {"name": "t", "workload": "mlp", "train": {"steps": 90}, "search": SEARCH}
    return validate_spec({**base, **overrides})


def _settings(spec, **axes) -> TrialSettings:
    s = {"devices": 1, "batch_size": 32, "precision": "fp32", "compile": "eager"}
    s |= {"data_workers": 1, "input": "ray_data", "prefetch_batches": 2, "sync": "ddp"}
    return TrialSettings(**{**s, **axes}, params={}, axis_params={}, options={})


def test_ranking_rungs_keep_and_the_next_rung_continues_the_same_repeat():
    spec = _spec()  # rungs of 10, 30, 90 steps; the last one measures each finalist twice
    eager = _settings(spec)
    assert continuation(spec, "t", eager, 0, None) == {}  # a grid sweep
    assert continuation(spec, "t", eager, 0, 0) == {"keep": True, "continues": None}
    assert continuation(spec, "t", eager, 0, 1) == {"keep": True, "continues": "t/0/0"}
    assert continuation(spec, "t", eager, 0, 2) == {"keep": False, "continues": "t/0/1"}
    # the last rung's second repeat has no earlier run to continue: it starts fresh
    assert continuation(spec, "t", eager, 1, 2) == {"keep": False, "continues": None}


def test_what_is_never_kept_starts_again_each_rung():
    spec = _spec()
    for axes in ({"compile": "inductor"}, {"compile": "torchscript"}, {"sync": "param_server"}):
        settings = _settings(spec, **axes)
        # inductor compiles into caches of its own at every rung (worker/compile_dirs.py)
        own = {"own_compile_caches": True} if axes == {"compile": "inductor"} else {}
        # nothing kept at any rung; a promoted run's row says why it started again
        assert continuation(spec, "t", settings, 0, 0) == own, axes
        why = continuation(spec, "t", settings, 0, 1)["fresh_because"]
        assert why.startswith(f"{next(iter(axes))} {next(iter(axes.values()))} starts fresh")
        assert continuation(spec, "t", settings, 0, 2) == {**own, "fresh_because": why}
        # a repeat the rung before did not run is new, not started again
        assert continuation(spec, "t", settings, 1, 2) == own, axes
    off = _spec(search={**SEARCH, "continue_rungs": False})
    assert continuation(off, "t", _settings(off), 0, 1) == {}
    # nor own compile caches: the restarting arm restarts everything
    assert continuation(off, "t", _settings(off, compile="inductor"), 0, 1) == {}
    # a constraint on validation makes every rung a full one: nothing kept, nothing continued
    full = _spec(search={**SEARCH, "constraints": ["val_accuracy >= 0.5"]})
    assert continuation(full, "t", _settings(full), 0, 1) == {"keep": False, "continues": None}
