"""belayq as a kombu transport (work in progress)."""
