"""Which trials run the profiler pass, and the training rows a trial reads with it
(protocol/sizing.py)."""

from trial_runner import launch_config, trial_config

from amdahl.protocol.sizing import _rows_per_trial, profiles


def test_which_trials_profile():
    assert profiles(3, 2, "ddp", ranking_only=False)
    assert not profiles(0, 2, "ddp", ranking_only=False)  # train.profile_steps: 0 turns it off
    assert not profiles(3, 1, "ddp", ranking_only=False)  # one device: nothing to overlap
    assert not profiles(3, 2, "none", ranking_only=False)  # no communication
    assert not profiles(3, 2, "ddp", ranking_only=True)  # a ranking-only search rung


def test_the_input_holds_the_profiled_steps():
    ddp = trial_config(devices=2, sync="ddp")
    with_pass = _rows_per_trial(launch_config((ddp,), profile_steps=4), ddp)
    without = _rows_per_trial(launch_config((ddp,), profile_steps=0), ddp)
    assert with_pass - without == (1 + 4) * ddp.per_device_batch  # warm-up step + 4 traced
