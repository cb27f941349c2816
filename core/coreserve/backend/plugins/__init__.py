"""The plugin layer: the hooks a plugin implements, the pluggy wrapper that loads them from entry
points, the registry of their backends and the subcommands they add."""
