"""What the library raises for a problem its caller has to fix: one family under `CountersignError`.

Guarantee: library code never ends the process. A setting that is wrong or missing, tools that do
not load, a policy that cannot be applied, or a service that cannot be served is a `CountersignError`
whose message is one line saying what to fix (and `.setting` names the setting when one is to blame).
Only the console commands (`python -m countersign`, the `countersign` script) turn it into that line
on stderr and a non-zero exit. Importing this module imports nothing else.
"""

from __future__ import annotations


class CountersignError(Exception):
    """The base of every error Countersign raises for its caller to fix; the message is one line."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        """The setting to change (as spelled in the environment), when one is to blame."""


class SettingsError(CountersignError):
    """A setting that is wrong or missing (`.setting` names it)."""

    setting: str

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message, setting=setting)


class ToolsError(CountersignError):
    """Tools that cannot be loaded: an import path that does not import or holds no tools, something
    that is not a `Tool`, or a tool name used twice."""


class PolicyError(CountersignError):
    """A policy that cannot be applied: the policy file (unreadable, an invalid table, a table for a
    tool that is not loaded), or, for one call, approvers that could not be named."""


class ServicesError(CountersignError, ValueError):
    """A Restate service that cannot be served (COUNTERSIGN_SERVICES or `create_app(services=...)`).
    Also a `ValueError`, as it was before the family existed."""
