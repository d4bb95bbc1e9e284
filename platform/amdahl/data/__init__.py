"""Stored datasets and their driver-side preparation."""
