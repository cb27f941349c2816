"""The response cache (`--cache-config`, `response_cache { enable: true }`): its settings, the
key a request is filed under, and the local and Redis caches."""
