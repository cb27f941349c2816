"""`python -m coreserve` runs the `coreserve` command."""

from coreserve.cli import main

raise SystemExit(main())
