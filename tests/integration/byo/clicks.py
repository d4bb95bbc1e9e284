"""A helper module beside the workload's package, imported by it at module level."""

import numpy as np


def click_rule(raw_ids: np.ndarray) -> np.ndarray:
    """A user clicks when most of their history is in the "popular" half of the items."""
    return ((raw_ids % 10 < 5).mean(axis=1) > 0.5).astype(np.int64)
