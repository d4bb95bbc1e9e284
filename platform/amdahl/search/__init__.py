"""Search over a sweep's configurations: the search section's checks (`spec_checks`), objectives and
constraints (`objectives`, which the report ranks by too) and successive halving's decisions
(`halving`). Pure."""
