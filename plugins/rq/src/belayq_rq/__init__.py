"""belayq under RQ (work in progress)."""
