"""The tool registry: each tool's argument model, description, default policy and effect.

Guarantee: a tool runs only with arguments that validated against its pydantic model, and its
effect receives the idempotency key of the call, so a re-run after a crash finds its own earlier
effect instead of repeating it. A registry is checked whole when it is built: duplicate names, a
confirm or editable field that is not an argument, a policy-file table for a tool that is not loaded,
or an invalid policy raise a one-line ToolsError or PolicyError (countersign.exceptions) naming the
tool, before anything is served.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import logging
import re
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ValidationError

from countersign.exceptions import PolicyError, ToolsError
from countersign.settings import parse_tools_spec
from countersign.tools.conditions import condition_variables
from countersign.tools.policy import ToolPolicy
from countersign.tools.policy_file import POLICY_FILE, load_overrides, merge

log = logging.getLogger(__name__)

TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}\Z")
"""What every model provider accepts as a function name."""
SUMMARY_LIMIT = 200
SETTING = "COUNTERSIGN_TOOLS"


class ToolError(Exception):
    """A business refusal (order not found, amount too high): final, reported to the model."""


@dataclass(frozen=True)
class EditRule:
    """Which way an approver may change one argument; the tool's model still validates the result."""

    direction: Literal["any", "decrease_only"] = "any"

    def describe(self) -> str:
        return "may only be lowered" if self.direction == "decrease_only" else "may be changed"


@dataclass(frozen=True, kw_only=True)
class EffectContext:
    """What an effect (or precondition) is told about the call it carries out."""

    idempotency_key: str
    """`<run_id>/<index>`: the same on every retry of this call; send it to the API you call."""
    run_id: str
    tenant: str = ""
    requester: str = ""
    approval_id: str | None = None
    """None when the call ran autonomously (its policy did not gate it)."""
    approved_by: tuple[str, ...] = ()
    edits: dict[str, Any] | None = None
    """The arguments an approver changed (already applied to the arguments the effect receives)."""


Effect: TypeAlias = Callable[[Any, EffectContext], dict[str, Any] | Awaitable[dict[str, Any]]]
Precondition: TypeAlias = Callable[[Any, EffectContext], str | Awaitable[str | None] | None]
ContextReader: TypeAlias = Callable[[Any, EffectContext], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
"""Read-only: a few labelled facts for the approver of a proposed call (label -> value)."""


@dataclass(frozen=True, kw_only=True)
class Tool:
    """One tool the agent may call. `name`, `description`, `args_model`, `effect` and `policy` are enough.

    `effect(args, ctx)` receives the validated arguments (an `args_model` instance) and an
    EffectContext; it returns a JSON-able dict for the model and raises ToolError for a business
    refusal. It may be `async def` or a plain function (a plain one runs in a worker thread).
    """

    name: str
    description: str
    args_model: type[BaseModel]
    effect: Effect
    policy: ToolPolicy
    summarize: Callable[[Any], str] | None = None
    """One line for the approver (default: the tool's name and its arguments)."""
    editable: Mapping[str, EditRule] = field(default_factory=dict)
    precondition: Precondition | None = None
    """Checked right before execution; returns what changed in the world since approval, or None."""
    confirm_field: str | None = None
    """The argument an approver retypes to confirm a high-stakes call (else the fingerprint)."""
    context: ContextReader | None = None
    """Read-only facts that bear on the decision (label -> value), read once when a gated call is
    frozen, bounded by TOOL_CONTEXT_TIMEOUT_SECONDS; shown to the approver and kept in the audit."""

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ValueError(f"tool {self.name!r}: {problem}")

    def _problem(self) -> str | None:
        if not isinstance(self.name, str) or not TOOL_NAME.match(self.name):
            return "name must be 1-64 letters, digits, _ or - (starting with a letter)"
        if not isinstance(self.description, str) or not self.description.strip():
            return "description must be a non-empty string"
        if not (isinstance(self.args_model, type) and issubclass(self.args_model, BaseModel)):
            return "args_model must be a pydantic BaseModel subclass"
        if not callable(self.effect):
            return "effect must be a function (args, ctx) -> dict"
        if self.context is not None and not callable(self.context):
            return "context must be a function (args, ctx) -> {label: value}"
        if not isinstance(self.policy, ToolPolicy):
            return "policy must be a ToolPolicy"
        fields = self.args_model.model_fields
        if self.confirm_field and self.confirm_field not in fields:
            return f"confirm_field {self.confirm_field!r} is not one of its arguments"
        unknown = sorted(set(self.editable) - set(fields))
        if unknown:
            return f"editable fields {unknown} are not among its arguments"
        if any(not isinstance(rule, EditRule) for rule in self.editable.values()):
            return "editable must map argument names to EditRule"
        return None

    def validate(self, raw: Mapping[str, Any]) -> BaseModel:
        return self.args_model.model_validate(dict(raw))

    def schema(self) -> dict[str, Any]:
        return copy.deepcopy(_json_schema(self.args_model))

    def summary(self, args: BaseModel) -> str:
        if self.summarize is not None:
            return self.summarize(args)
        shown = ", ".join(f"{k}={v}" for k, v in args.model_dump(mode="json").items())
        text = f"{self.name}({shown})"
        return text if len(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT - 1] + "…"


@functools.cache
def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    # Every model turn lists every tool's schema; generating one costs about 0.2 ms of CPU.
    return model.model_json_schema()


class Registry:
    """The loaded tools, by name, with the policy file's overrides applied."""

    def __init__(self, tools: Sequence[Tool], policy_file: Path | None = None, *, source: str = "code") -> None:
        self.source = source
        seen: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in seen:
                raise ToolsError(f"{source}: tool name {tool.name!r} is defined twice")
            seen[tool.name] = tool
        overrides = load_overrides(policy_file)
        unknown = set(overrides) - set(seen)
        if unknown:
            raise PolicyError(
                f"{POLICY_FILE} names tools that are not loaded: {sorted(unknown)} (loaded: {sorted(seen)})",
                setting=POLICY_FILE,
            )
        self._tools = {
            name: replace(
                tool,
                policy=merge(
                    tool.policy, overrides.get(name), source=f"{POLICY_FILE} [tools.{name}]", setting=POLICY_FILE
                ),
            )
            for name, tool in seen.items()
        }
        for tool in self._tools.values():
            _warn_on_unknown_names(tool)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)


def _warn_on_unknown_names(tool: Tool) -> None:
    """A condition naming no argument gates every call (fail closed); say so at start."""
    fields = set(tool.args_model.model_fields)
    for attr in ("when", "high_stakes_when"):
        condition = getattr(tool.policy, attr)
        if condition is None:
            continue
        # Names bound inside macros (`items.exists(i, ...)`) are listed too: hence a warning, not a refusal.
        strangers = sorted(set(condition_variables(condition)) - fields)
        if strangers:
            log.warning("tool %s: %s names %s, not among its arguments %s", tool.name, attr, strangers, sorted(fields))


def load_tools(specs: str | Sequence[str]) -> list[Tool]:
    """The tools named by `module:ATTR` import paths (a list of Tool or a Registry each), in order.

    Raises ToolsError (one line naming COUNTERSIGN_TOOLS and the path) on a module that does not
    import, a missing attribute, something that is not tools, or a name defined twice."""
    if isinstance(specs, str):
        try:
            specs = parse_tools_spec(specs)
        except ValueError as exc:
            raise ToolsError(f"{SETTING}: {exc}", setting=SETTING) from None
    tools: list[Tool] = []
    where: dict[str, str] = {}
    for spec in specs:
        for tool in _tools_at(spec):
            if tool.name in where:
                raise ToolsError(
                    f"{SETTING}: tool name {tool.name!r} is defined twice ({where[tool.name]}, {spec})", setting=SETTING
                )
            where[tool.name] = spec
            tools.append(tool)
    if not tools:
        raise ToolsError(f"{SETTING}={','.join(specs)}: names no tools", setting=SETTING)
    return tools


def _tools_at(spec: str) -> list[Tool]:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise _refused(spec, f"no module named {module_name!r} (is it on sys.path?)") from None
        raise _refused(spec, f"importing {module_name} failed: {_failure(exc)}") from None
    except Exception as exc:  # the user's module raised while defining its tools
        raise _refused(spec, f"importing {module_name} failed: {_failure(exc)}") from None
    if not hasattr(module, attr):
        raise _refused(spec, f"module {module_name} has no attribute {attr!r}")
    value = getattr(module, attr)
    if isinstance(value, Registry):
        return list(value)
    if not isinstance(value, list | tuple):
        raise _refused(spec, f"is a {type(value).__name__}, not a list of Tool or a Registry")
    for position, item in enumerate(value):
        if not isinstance(item, Tool):
            raise _refused(spec, f"item {position} is a {type(item).__name__}, not a countersign.Tool")
    return list(value)


def _refused(spec: str, problem: str) -> ToolsError:
    return ToolsError(f"{SETTING}={spec}: {problem}", setting=SETTING)


def _failure(exc: Exception) -> str:
    """The exception on one line, at the innermost frame of the user's code (where the tool is defined)."""
    text = validation_message(exc) if isinstance(exc, ValidationError) else (str(exc).splitlines() or [""])[0]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_NOT_USER_CODE)]
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {text}{at}"


_NOT_USER_CODE = (str(Path(__file__).resolve().parents[1]), "<frozen", sys.prefix, sys.base_prefix)


def is_async(function: Callable[..., Any]) -> bool:
    # An object with an `async def __call__` counts too.
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)


def validation_message(exc: ValidationError) -> str:
    """A short, model-readable account of what was wrong with the arguments."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
