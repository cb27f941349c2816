"""What dynamic batching gains, over HTTP binary and gRPC."""
