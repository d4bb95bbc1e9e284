"""The driver process: Ray, Tune and Train wiring, the sweep's lifecycle, calibration."""
