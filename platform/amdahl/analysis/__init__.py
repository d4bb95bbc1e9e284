"""Pure analysis below search and report: statistics, scaling fits, alpha-beta, the calibration
file's values and the step-time model."""
