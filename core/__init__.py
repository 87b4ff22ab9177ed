"""persistshard.core."""
