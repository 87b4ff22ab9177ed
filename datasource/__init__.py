"""persistshard.datasource."""
