"""A halving rung continues a trial kept from the rung before (worker/resident.py): it must
compute what one uninterrupted run of the same steps computes, and its row must pool the
windows while set-up, warmup and first-step figures stay the first item's."""

import torch
from trial_runner import PARAMS, continued_and_whole, loader_source, trial_config

from amdahl.protocol.items import WorkItem
from amdahl.worker.input import LoaderSource, LocalShard
from amdahl.worker.resident import ResidentTrials, unkeepable
from amdahl.worker.trial import Placement
from workloads.mlp import MLP

CPU = Placement(torch.device("cpu"), 0, 1)


def _losses(stats: dict) -> list[float]:
    return stats["history"]["loss"]


def test_a_continued_trial_computes_what_one_uninterrupted_run_does():
    # another configuration in between, as in a rung: its own reset and compiled graphs (a
    # kept TorchScript trial fails there, in backward: continuation is for eager trials only)
    other = trial_config(trial_id="other", compile="torchscript", precision="bf16")
    whole, first, second, _ = continued_and_whole(MLP(**PARAMS), trial_config(), other, CPU)

    assert (first["windows"], second["windows"], whole["windows"]) == (1, 2, 1)
    assert second["measured_steps"] == whole["measured_steps"] == 30
    # the same steps, the same batches, the same losses (CPU, one thread of math: bit for bit)
    assert _losses(second) == _losses(whole)
    assert second["final_loss"] == whole["final_loss"]
    assert second["val_loss"] == whole["val_loss"]
    # set-up, warmup and first step are the first item's, not re-run
    for column in ("setup_s", "warmup_s", "first_step_s", "compile_s"):
        assert second[column] == first[column], column
    # the window is both items' steps, not the wall between them; the item's own is its own
    assert second["window_s"] == first["window_s"] + second["item_window_s"]
    assert second["window_opened_unix"] > first["window_opened_unix"]
    # the pause between the items (the other trial) is neither input wait nor elapsed time
    elapsed = second["history"]["elapsed_s"]
    assert elapsed == sorted(elapsed)
    assert max(second["history"]["data_wait_s"]) < 0.5 * (elapsed[-1] - elapsed[0])


def test_kept_trials_stay_within_the_budget_oldest_out_and_say_why_they_went():
    residents = ResidentTrials(torch.device("cpu"), workers=1)
    residents.budget_bytes = 100
    closed: list[str] = []

    class _Kept:
        def __init__(self, name: str):
            self.name = name

        def close(self) -> None:
            closed.append(self.name)

    def item(tid: str, rung: int, continues: str | None = None) -> WorkItem:
        return WorkItem(f"{tid}/0/{rung}", "launch", tid, 0, rung, keep=True, continues=continues)

    residents.keep(item("a", 0), _Kept("a"), 60)
    residents.keep(item("b", 0), _Kept("b"), 60)  # no room for both: a goes
    residents.keep(item("c", 0), _Kept("c"), 150)  # never fits: not kept
    assert closed == ["a", "c"]
    got, why = residents.take(item("b", 1, continues="b/0/0"), 1, torch.device("cpu"))
    assert got.name == "b" and why is None
    got, why = residents.take(item("a", 1, continues="a/0/0"), 1, torch.device("cpu"))
    assert got is None and "make room" in why
    got, why = residents.take(item("c", 1, continues="c/0/0"), 1, torch.device("cpu"))
    assert got is None and "over the" in why
    got, why = residents.take(item("d", 1, continues="d/0/0"), 1, torch.device("cpu"))
    assert got is None and "not kept in this worker group" in why
    # a kept trial of a rung two before the item's is never continued: dropped
    residents.keep(item("e", 1), _Kept("e"), 10)
    residents.take(item("f", 3), 1, torch.device("cpu"))
    assert closed[-1] == "e" and residents.held_bytes() == 0


def test_only_inputs_whose_iterators_hold_no_process_are_kept():
    workload = MLP(**PARAMS)
    assert unkeepable(loader_source(workload)) is None  # a DataLoader in the training process
    with_workers = LoaderSource(None, workload, rank=0, world=1, workers=2)
    assert "data_workers 2" in unkeepable(with_workers)
    assert unkeepable(LocalShard([], 0.0)) is None  # the shard's tables, in the worker
    assert "Ray Data shard" in unkeepable(object())  # Ray's own iterator over a big shard


def test_a_kept_trial_let_go_is_collected_though_it_was_frozen_with_the_launch():
    """The harness freezes what survives each item, kept trials too; one let go later has
    cycles (DDP's hooks, autograd's) that a frozen heap never collects."""
    import gc
    import weakref

    class _Cyclic:
        def __init__(self):
            self.me = self  # a reference cycle: only the collector frees it

        def close(self) -> None:
            pass

    residents = ResidentTrials(torch.device("cpu"), workers=1)
    residents.budget_bytes = 10
    trial = _Cyclic()
    alive = weakref.ref(trial)
    residents.keep(WorkItem("a/0/0", "launch", "a", 0, 0, keep=True), trial, 10)
    del trial
    gc.collect()
    gc.freeze()  # what worker/harness.py does after each item
    try:
        assert not residents.thaw_if_released()  # nothing let go: the heap stays frozen
        assert gc.get_freeze_count() > 0
        residents.keep(WorkItem("b/0/0", "launch", "b", 0, 0, keep=True), _Cyclic(), 10)
        gc.collect()
        assert alive() is not None  # let go (a made room for b) but frozen: not collected
        assert residents.thaw_if_released()
        gc.collect()
        assert alive() is None
    finally:
        gc.unfreeze()
