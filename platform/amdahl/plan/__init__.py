"""From a spec to trials, their resources and launches. Pure: no Ray, no torch."""
