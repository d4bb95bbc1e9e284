"""A user's own package, as a new user writes it from docs/workload.md (never installed)."""
