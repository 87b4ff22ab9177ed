"""Spark looks for this module by name; it registers the format `persistshard`."""
