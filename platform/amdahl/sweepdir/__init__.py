"""A sweep directory on disk: its file names, lock, resume checks and the results table."""
