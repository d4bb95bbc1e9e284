"""What the driver and the Ray Train workers agree on, as plain data and pure functions: the
launch contract (`contract`: LaunchConfig, TrialConfig, WorkerResources, the collective
timeout), the work items the driver's queue hands out and their keys (`items`), the identity
of a results row and a failure's status (`identity`), and how many training rows a launch's
ranks read (`sizing`).

Both sides import it; it imports neither of them, nor Ray or torch, so the driver can build
and size a launch without loading the worker side (docs/architecture.md, "The launch
contract").
"""
