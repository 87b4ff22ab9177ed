"""persistshard.format."""
