"""Helpers the test folders share (as pytest's `pytester`): import them as `support.<module>`."""
