"""Servers and processes the tests start beside coreserve, and the repositories they serve."""
