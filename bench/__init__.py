"""Benchmarks: what durability costs Countersign, measured against a bare Restate floor in the same run.

Guarantee: `python -m bench` starts its own restate-server and handler processes on free loopback
ports, runs bounded loads only against them, and stops every process it started before it exits.

The process helpers of the test suite (`tests/support`) are reused as they are: the folder is put on
`sys.path` here, so the bench and the tests start servers the same way without moving shared code.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_TEST_SUPPORT_ROOT = str(REPO / "tests")
if _TEST_SUPPORT_ROOT not in sys.path:
    sys.path.append(_TEST_SUPPORT_ROOT)
