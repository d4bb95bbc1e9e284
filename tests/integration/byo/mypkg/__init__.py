"""A user's own package, as a new user writes it from the README (never installed)."""
