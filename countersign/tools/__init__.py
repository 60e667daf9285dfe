"""Tools the agent may call: the registry, the demo tools and their business database.

Guarantee: the process serves the tools COUNTERSIGN_TOOLS names, then those given in code
(`create_app(tools=...)`); the demo tools only when neither names any and COUNTERSIGN_ENV=dev (or
when named like any other set). With none named, a process that serves handlers of its own
(COUNTERSIGN_SERVICES, or `create_app(services=...)`: questions with `ask_person`, say) serves no
tools, unless it is in dev and the demo tools are there to load (a checkout). Anywhere else, no
tools is a SettingsError naming COUNTERSIGN_TOOLS, so production never serves the demo, or nothing,
by accident. The set is built once, with the policy file's overrides, and any problem is a typed
error (countersign.exceptions) raised before anything is served.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from countersign.exceptions import SettingsError, ToolsError
from countersign.settings import Settings, get_settings
from countersign.tools.registry import SETTING, Registry, Tool, load_tools

DEMO_TOOLS = "handlers.demo.tools:DEMO_TOOLS"
"""The tools loaded in dev when no tools are named, by import path like any other set (the tools SDK
does not depend on its demo)."""
IN_CODE = "create_app(tools=...)"
NO_TOOLS = (
    f"{SETTING} is not set and no tools were given to {IN_CODE}: name yours ({SETTING}=package.module:ATTR); "
    f"the demo tools load only with COUNTERSIGN_ENV=dev or when named ({SETTING}={DEMO_TOOLS}); a process "
    "that serves only handlers of its own names them in COUNTERSIGN_SERVICES"
)

_process: Registry | None = None


def build_registry(settings: Settings, tools: Iterable[Tool] = (), *, own_services: bool = False) -> Registry:
    """COUNTERSIGN_TOOLS's tools, then `tools`, with the policy file's overrides (see the module's
    guarantee for the demo tools; `own_services`: services were given in code). ToolsError,
    PolicyError or SettingsError on a problem."""
    given = list(tools)
    for position, item in enumerate(given):
        if not isinstance(item, Tool):
            hint = f" (import paths go in {SETTING})" if isinstance(item, str) else ""
            raise ToolsError(f"{IN_CODE}: item {position} is a {type(item).__name__}, not a countersign.Tool{hint}")
    named = load_tools(settings.countersign_tools) if settings.countersign_tools else []
    sources = [f"{SETTING}={','.join(settings.countersign_tools)}"] if named else []
    sources += [IN_CODE] if given else []
    dev, own = settings.countersign_env == "dev", bool(settings.countersign_services) or own_services
    if not sources and dev and (not own or _demo_present()):
        named, sources = load_tools([DEMO_TOOLS]), [f"the demo tools ({SETTING} is unset, COUNTERSIGN_ENV=dev)"]
    elif not sources and own:
        sources = [f"none ({SETTING} is unset; the process serves handlers of your own)"]
    elif not sources:
        raise SettingsError(SETTING, NO_TOOLS)
    return Registry([*named, *given], settings.approvals_policy_file, source=" and ".join(sources))


def _demo_present() -> bool:
    """Whether the demo tools' package is there to import (a checkout; an installed wheel has none)."""
    try:
        return importlib.util.find_spec(DEMO_TOOLS.split(":")[0]) is not None
    except ImportError:  # its parent package is missing
        return False


def use_tools(settings: Settings, tools: Iterable[Tool] | None = None, *, own_services: bool = False) -> Registry:
    """The tools this process serves. With `tools` (even none): built from `settings` and `tools`, and
    from then on the process's tools. Without: the process's tools, built from `settings` the first
    time (`own_services`: the process serves services given in code, see `build_registry`)."""
    global _process
    if tools is None and _process is not None:
        return _process
    _process = build_registry(settings, () if tools is None else tools, own_services=own_services)
    return _process


def default_registry() -> Registry:
    """The process's tools: those `create_app` (or `startup.check`) set, else built from the settings
    on first use. Loaded once; fails fast."""
    return use_tools(get_settings())
