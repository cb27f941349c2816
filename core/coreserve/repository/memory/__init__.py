"""Model memory: measuring each load, the budgets of `--model-memory-budget`, loading on
demand and unloading the least recently used models to make room."""
