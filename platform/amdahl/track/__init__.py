"""Mirroring the results table to an experiment tracker (MLflow); the driver is the only
writer."""
