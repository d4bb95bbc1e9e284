"""The Ray Train worker processes: the launch contract and the timed training loop."""
