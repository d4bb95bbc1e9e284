"""The launch contract (protocol/contract.py): the collective timeout, a trial's settings held
whole, and the pickle it crosses processes by."""

import pickle

from trial_runner import launch_config, trial_config

from amdahl.columns import TrialSettings
from amdahl.protocol.contract import COLLECTIVE_TIMEOUT_S, TrialConfig, collective_timeout_s


def _trial(compile_="eager", mode="default"):
    return trial_config(compile=compile_, options={"compile_mode": mode})


def test_collective_timeout_outlasts_the_slowest_compile_of_the_launch():
    assert collective_timeout_s([_trial()]) == COLLECTIVE_TIMEOUT_S["eager"]
    assert collective_timeout_s([_trial(), _trial("inductor")]) == COLLECTIVE_TIMEOUT_S["inductor"]
    slowest = collective_timeout_s([_trial("inductor", "max-autotune"), _trial("torchscript")])
    assert slowest == COLLECTIVE_TIMEOUT_S["max-autotune"] > COLLECTIVE_TIMEOUT_S["inductor"]


def test_a_trial_config_holds_the_settings_and_declares_none_of_their_fields():
    """An axis is declared in the schema, AXES and TrialSettings; the contract only carries it."""
    declared = set(TrialConfig.__dataclass_fields__)
    assert not declared & set(TrialSettings.__dataclass_fields__)
    assert "settings" in declared


def test_the_contract_pickles_as_it_crosses_processes():
    trial = trial_config(sync="ddp", devices=2)
    launch = launch_config((trial,))
    again = pickle.loads(pickle.dumps(launch))
    assert again == launch and again.trials[0].settings == trial.settings
    assert again.trials[0].micro_steps == trial.micro_steps
