"""The Countersign tools an adapter offers its framework's model, resolved by name against the
loaded registry (the tools COUNTERSIGN_TOOLS or create_app(tools=...) loaded).

Guarantee: a name that is not loaded is refused where the agent is built (at import, when
COUNTERSIGN_SERVICES loads it), so a misspelt tool stops the process at start, not a run.
"""

from __future__ import annotations

from collections.abc import Sequence

from countersign.tools import default_registry
from countersign.tools.registry import Tool


def loaded_tools(tools: Sequence[str | Tool] | None, caller: str) -> list[Tool]:
    """The loaded tools `tools` names (or gives; None: every loaded tool), in that order."""
    registry = default_registry()
    names = registry.names() if tools is None else [t if isinstance(t, str) else t.name for t in tools]
    missing = [name for name in names if registry.get(name) is None]
    if missing:
        raise ValueError(
            f"{caller}: {', '.join(missing)} not among the loaded tools ({', '.join(registry.names())}); "
            "load them with COUNTERSIGN_TOOLS"
        )
    return [tool for name in names if (tool := registry.get(name)) is not None]
