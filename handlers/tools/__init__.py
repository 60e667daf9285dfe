"""Tools the agent may call: the registry, the demo tools and their business database."""

from __future__ import annotations

import functools

from handlers.settings import get_settings
from handlers.tools.demo import DEMO_TOOLS
from handlers.tools.registry import Registry


@functools.cache
def default_registry() -> Registry:
    """The demo tools with the policy file's overrides applied; loaded once, fails fast."""
    return Registry(DEMO_TOOLS, get_settings().approvals_policy_file)
