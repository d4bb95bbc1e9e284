"""Search over a sweep's configurations (successive halving). Pure."""
