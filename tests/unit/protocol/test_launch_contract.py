"""The launch contract's derived values (protocol/contract.py): the collective timeout."""

from trial_runner import trial_config

from amdahl.protocol.contract import COLLECTIVE_TIMEOUT_S, collective_timeout_s


def _trial(compile_="eager", mode="default"):
    return trial_config(compile=compile_, options={"compile_mode": mode})


def test_collective_timeout_outlasts_the_slowest_compile_of_the_launch():
    assert collective_timeout_s([_trial()]) == COLLECTIVE_TIMEOUT_S["eager"]
    assert collective_timeout_s([_trial(), _trial("inductor")]) == COLLECTIVE_TIMEOUT_S["inductor"]
    slowest = collective_timeout_s([_trial("inductor", "max-autotune"), _trial("torchscript")])
    assert slowest == COLLECTIVE_TIMEOUT_S["max-autotune"] > COLLECTIVE_TIMEOUT_S["inductor"]
