"""The Ray Train worker processes: the timed training loop and what it needs on the workers.

The driver imports only the entry points: `harness.train_launch` (a launch's training
function) and `calibration_measurement` (the calibration measurement); everything else it
shares with the workers is plain data in amdahl.protocol.
"""
