"""Clients that speak HTTP/1.1 and HTTP/2 by hand, and the certificates of the TLS tests."""
