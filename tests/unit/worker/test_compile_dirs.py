"""A search's compiled configuration compiles into caches of its own (worker/compile_dirs.py):
its first rung fills them with a cold compile, its later rungs load their graphs from them; a
grid's trials and `compile_cache: warm` are left as they were."""

import os

import pytest
import torch
from torch._dynamo.utils import counters
from trial_runner import PARAMS, launch_config, loader_source, trial_config

from amdahl.protocol.items import WorkItem
from amdahl.worker import compile_dirs
from amdahl.worker.compile_dirs import ConfigurationCaches
from amdahl.worker.input import validation_rows
from amdahl.worker.trial import Placement, TrialRun, run_trial_guarded
from workloads.mlp import MLP


def _item(trial_id="a", repeat=0, rung=0, own=True):
    key = f"{trial_id}/{repeat}/{rung}"
    return WorkItem(key, "launch", trial_id, repeat, rung, own_compile_caches=own)


def test_a_configurations_later_rungs_get_the_directory_its_first_filled():
    caches = ConfigurationCaches()
    inductor = trial_config(compile="inductor")
    # the driver did not ask (a grid, time-to-target, continue_rungs: false)
    assert caches.directory(_item(rung=None, own=False), inductor) == (None, False)
    assert caches.directory(_item(), trial_config()) == (None, False)  # eager
    warm = trial_config(compile="inductor", options={"compile_cache": "warm"})
    assert caches.directory(_item(), warm) == (None, False)
    first, reused = caches.directory(_item(), inductor)
    assert first.is_dir() and not any(first.iterdir()) and not reused
    # an empty directory (the first rung compiled nothing there, or failed) is no reuse
    assert caches.directory(_item(rung=1), inductor) == (first, False)
    (first / "graph").write_text("compiled")
    assert caches.directory(_item(rung=2), inductor) == (first, True)
    other, _ = caches.directory(_item(repeat=1), inductor)  # each repeat its own
    assert other != first
    caches.close()
    assert not first.exists() and not other.exists()


def test_a_configuration_no_later_rung_can_promote_loses_its_directory(monkeypatch):
    caches = ConfigurationCaches()
    inductor = trial_config(compile="inductor")
    a, _ = caches.directory(_item("a"), inductor)
    b, _ = caches.directory(_item("b"), inductor)
    caches.directory(_item("a", rung=1), inductor)  # a promoted; b was not
    assert a.exists() and b.exists()  # rung 1 is still ranking rung 0's survivors
    caches.directory(_item("a", rung=2), inductor)  # b's last rung is two back: gone
    assert a.exists() and not b.exists()
    # and a cap on the count, oldest out, beyond that rule
    monkeypatch.setattr(compile_dirs, "MAX_KEPT", 2)
    c, _ = caches.directory(_item("c", rung=2), inductor)
    d, _ = caches.directory(_item("d", rung=2), inductor)
    assert c.exists() and d.exists() and not a.exists()
    caches.close()


def test_a_trial_compiled_into_its_own_caches_again_loads_its_graphs(tmp_path):
    """The same inductor trial twice through run_trial, each time after the per-trial reset of
    what earlier trials compiled: into one directory the second finds its graphs in inductor's
    cache; the first, into an empty one, compiled them."""
    workload, device = MLP(**PARAMS), torch.device("cpu")
    trial = trial_config(compile="inductor")
    source, val = loader_source(workload), validation_rows(workload, None, seed=0)
    outcomes = []
    env = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    for _ in range(2):
        counters.clear()
        stats, error, _ = run_trial_guarded(
            TrialRun(
                workload,
                trial,
                launch_config((trial,)),
                source,
                val,
                Placement(device, 0, 1),
                compile_dir=tmp_path,
            )
        )
        assert error is None, error
        outcomes.append((dict(counters["inductor"]), stats["compile_s"], stats["final_loss"]))
    (first, first_s, first_loss), (second, second_s, second_loss) = outcomes
    assert first.get("fxgraph_cache_miss", 0) >= 1 and not first.get("fxgraph_cache_hit")
    assert second.get("fxgraph_cache_hit", 0) >= 1 and not second.get("fxgraph_cache_miss")
    assert any(tmp_path.rglob("*")), "the graphs were cached somewhere else"
    assert second_loss == pytest.approx(first_loss, rel=1e-5)  # the same program, reloaded
    assert first_s > 0 and second_s > 0
    # the trial's cache directory is its own only while it runs
    assert {k: os.environ.get(k) for k in env} == env
