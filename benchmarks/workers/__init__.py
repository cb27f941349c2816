"""One worker process against N."""
