"""`python -m bench`: see bench.cli."""

from __future__ import annotations

from bench.cli import main

raise SystemExit(main())
