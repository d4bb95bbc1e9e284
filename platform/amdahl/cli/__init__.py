"""The `platform` command: argument parsing, printing and the live view; no logic."""
