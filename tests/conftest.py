"""Shared fixtures: generated datasets go to a per-session temp dir, never the user's cache."""

import os
import tempfile

# Set before amdahl.data.storage is imported anywhere in the test session.
os.environ.setdefault("AMDAHL_DATA_DIR", tempfile.mkdtemp(prefix="amdahl-test-data-"))
