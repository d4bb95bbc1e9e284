"""One worker group per shape serves a whole sweep (driver/pool.py): rungs, repeats and
trials go to the launch that is already up, a worker that dies gets its item again once, and
a trial measured in a long-lived group computes what it computes in a fresh one."""

import json
import time
from datetime import datetime

import pytest

from amdahl import read_results, run_sweep, validate_spec

pytestmark = pytest.mark.integration

BASE = {
    "workload": "mlp",
    "params": {"hidden": [32], "train_rows": 2048, "val_rows": 256},
    "train": {"steps": 12, "warmup_steps": 2, "seed": 7},
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    "tracking": {"enabled": False},
}


def test_a_halving_search_of_three_rungs_starts_one_worker_group(ray_cluster, tmp_path):
    spec = validate_spec(
        {
            **BASE,
            "name": "onegroup",
            "grid": {"devices": [1, 2], "batch_size": [16, 64], "sync": ["ddp", "none"]},
            "search": {"method": "halving", "min_steps": 3, "eta": 2},
        }
    )
    before = time.time()
    outcome = run_sweep(spec, runs_dir=tmp_path)
    rows = read_results(outcome.sweep_dir).to_pylist()
    assert sorted({r["rung"] for r in rows}) == [0, 1, 2]
    assert all(r["status"] in ("ok", "skipped") for r in rows), [r["error"] for r in rows]
    assert outcome.group_starts == 1  # Ray Train started one worker group for every rung
    assert len({r["launch_id"] for r in rows}) == 1
    # Only the first row of a worker group carries its start (launch_entered_unix_s).
    assert sum(r["launch_entered_unix_s"] is not None for r in rows) == 1
    # The worker stamps the window's opening: after its row's start, set-up and warmup, and
    # a window's length before the row ended; the summary's figure is the earliest of them.
    ok = [r for r in rows if r["status"] == "ok"]
    assert any(r["continued_from"] for r in ok)  # later rungs continue kept trials
    for r in ok:
        started = datetime.fromisoformat(r["started_at"]).timestamp()
        # a continuation sets up and warms up nothing: those columns are its first item's
        fresh = r["continued_from"] is None
        assert (r["item_measured_s"] == r["measured_s"]) == fresh
        set_up = r["setup_s"] + r["warmup_s"] if fresh else 0.0
        assert started + set_up <= r["window_opened_unix"] + 0.05
        assert r["window_opened_unix"] + r["item_measured_s"] <= started + r["wall_s"] + 0.05
        # an item's parts are disjoint pieces of its wall seconds; its hand-over precedes it
        parts = ("item_measured_s", "comm_probe_s", "validation_s", "profile_s")
        parts += ("flops_count_s",) + (("setup_s", "warmup_s") if fresh else ())
        assert sum(r[p] or 0.0 for p in parts) <= r["wall_s"] + 0.05  # maxes over ranks
        assert r["handover_s"] is not None and 0 <= r["handover_s"] < outcome.wall_s
    first = min(r["window_opened_unix"] for r in ok) - before
    assert 0 < outcome.first_measured_s <= first < outcome.first_measured_s + 2.0


def test_an_item_that_kills_its_worker_twice_fails_and_the_rest_go_on(ray_cluster, tmp_path):
    spec = validate_spec(
        {
            **BASE,
            "name": "killer",
            "workload": "flaky_workload:KillsItsWorker",
            "train": {**BASE["train"], "max_failures": 4},
            "grid": {"devices": [1], "batch_size": [16, 32], "params.kill": [False, True]},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path)
    rows = read_results(outcome.sweep_dir).to_pylist()
    keys = [(r["trial_id"], r["repeat"], r["rung"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4  # one row per run, nothing twice
    failed = sorted((json.loads(r["params"])["kill"], r["error"]) for r in rows if r["error"])
    assert [kill for kill, _ in failed] == [True, True]
    assert all("died 2 times" in error for _, error in failed)
    assert all(r["status"] == "ok" for r in rows if not json.loads(r["params"])["kill"])
    # Each killing item was handed out twice: a start, then a restart per death, each said so.
    assert outcome.group_starts == 5
    why = outcome.group_start_reasons
    assert why[0] == "first start of a shape" and len(why) == 5, why
    assert all(w.startswith("again") and ("died" in w or "failure" in w) for w in why[1:]), why


def test_a_trial_in_a_long_lived_group_computes_what_it_computes_in_a_fresh_one(
    ray_cluster, tmp_path
):
    """CPU, fixed seeds: the same configuration after three others in one worker group, and
    alone in a new one, gives bit-identical losses."""
    grid = {"devices": [1], "batch_size": [16, 32], "sync": ["ddp", "none"]}
    shared = run_sweep(
        validate_spec({**BASE, "name": "shared", "grid": grid}), runs_dir=tmp_path / "shared"
    )
    alone = run_sweep(
        validate_spec({**BASE, "name": "shared", "grid": {**grid, "batch_size": [32]}}),
        runs_dir=tmp_path / "alone",
    )
    assert shared.group_starts == 1 and alone.group_starts == 1
    rows = read_results(shared.sweep_dir).to_pylist()
    last = [r["trial_id"] for r in rows][-1]  # ran after the three others
    fresh = {r["trial_id"]: r for r in read_results(alone.sweep_dir).to_pylist()}
    assert last in fresh
    before = next(r for r in rows if r["trial_id"] == last)
    assert json.loads(before["history"])["loss"] == json.loads(fresh[last]["history"])["loss"]
    assert before["final_loss"] == fresh[last]["final_loss"]


def test_a_worker_killed_inside_a_continued_rung_loses_no_earlier_window(ray_cluster, tmp_path):
    """Halving keeps each rung's trials for the next; a worker that dies while one continues
    takes the kept trials with it. The rows already measured stay as they were, the killed item
    runs again fresh in the new group, saying why, and the rung after continues that."""
    spec = validate_spec(
        {
            **BASE,
            "name": "killcontinued",
            "workload": "flaky_workload:KillsItsContinuation",
            # rung 0: warmup 2 + 3 steps, 5 forwards; the promoted trial's continuation dies
            # in its second step (the 7th forward), once
            "params": {**BASE["params"], "kill_at": 7, "kill_marker": str(tmp_path / "killed")},
            "train": {**BASE["train"], "max_failures": 1},
            "grid": {"devices": [1], "batch_size": [16, 64]},
            "search": {"method": "halving", "min_steps": 3, "eta": 2, "skip_below": None},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path / "runs")
    assert (tmp_path / "killed").exists()
    rows = read_results(outcome.sweep_dir).to_pylist()
    by_rung = {k: [r for r in rows if r["rung"] == k] for k in (0, 1, 2)}
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    assert len(by_rung[0]) == 2 and all(r["windows"] == 1 for r in by_rung[0])
    assert outcome.group_starts == 2 and outcome.group_start_reasons[1].startswith("again")
    # the killed continuation (the rung's first), run again fresh in the new group
    again = by_rung[1][0]
    assert again["steps"] == 6 and (again["continued_from"], again["windows"]) == (None, 1)
    assert "not kept in this worker group" in again["restart_reason"]
    for last in by_rung[2]:  # the new group kept what it ran: the last rung continues it
        assert last["continued_from"] == f"{last['trial_id']}/0/1" and last["steps"] == 12
