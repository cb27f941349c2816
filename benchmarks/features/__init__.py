"""What a server feature costs or gains: the response cache, tracing, metrics."""
