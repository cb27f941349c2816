"""Which settings an analysis measures and in what order, with its progress and the checkpoint
that lets an interrupted analysis resume."""
