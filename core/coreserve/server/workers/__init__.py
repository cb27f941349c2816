"""Frontends on every core: worker processes that are each a whole server on the same ports,
and the supervisor that makes them one server to their users."""
