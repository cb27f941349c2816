"""Pure functions between wire formats and requests/responses; no I/O happens here."""
