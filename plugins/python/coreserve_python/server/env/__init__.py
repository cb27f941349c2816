"""Per-model Python environments: which interpreter runs a model's stubs, and the shared cache of
environments built from requirements.txt files."""
