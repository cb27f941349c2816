"""`python -m coreserve_python.stub FD SERVER_PID`: the command the server starts a stub with."""

from __future__ import annotations

import sys

from coreserve_python.stub._stub import main

if __name__ == "__main__":
    sys.exit(main(sys.argv))
