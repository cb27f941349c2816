"""Tensors as framework backends handle them: one merged call for a batch of requests, ragged
batches, and a model's own inputs and outputs."""
