"""A sweep directory on disk: file names, lock, resume checks, driver files, results table."""
