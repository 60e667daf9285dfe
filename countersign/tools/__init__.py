"""Tools the agent may call: the registry, the demo tools and their business database.

Guarantee: the loaded set is either the tools named by COUNTERSIGN_TOOLS or, when it is unset, the
demo tools; it is built once, with the policy file's overrides, and any problem stops the start.
"""

from __future__ import annotations

import functools

from countersign.settings import get_settings
from countersign.tools.registry import Registry, load_tools

DEMO_TOOLS = "countersign.demo.tools:DEMO_TOOLS"
"""The tools loaded when COUNTERSIGN_TOOLS is unset, by import path like any other set (the tools SDK
does not depend on its demo)."""


@functools.cache
def default_registry() -> Registry:
    """The loaded tools with the policy file's overrides applied; loaded once, fails fast."""
    settings = get_settings()
    if settings.countersign_tools:
        tools = load_tools(settings.countersign_tools)
        source = f"COUNTERSIGN_TOOLS={','.join(settings.countersign_tools)}"
    else:
        tools, source = load_tools([DEMO_TOOLS]), "the demo tools (COUNTERSIGN_TOOLS is unset)"
    return Registry(tools, settings.approvals_policy_file, source=source)
