"""The sweep file: its typed schema, loading and validation, `--set` overrides."""
