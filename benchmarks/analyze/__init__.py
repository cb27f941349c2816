"""`coreserve analyze`'s searches."""
