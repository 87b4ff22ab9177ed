"""persistshard.conformance."""
