"""Measuring one settings of a model: the client that drives the server, the load it sends
(coreserve's own generator or perf_analyzer), the server process and its GPUs while it runs."""
