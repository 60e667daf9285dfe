"""The Restate services one endpoint serves: Countersign's own, then the user's.

Guarantee: every `package.module:ATTR` named in `COUNTERSIGN_SERVICES` is imported when the endpoint
is built, which `startup.check` does before anything is served. A module that does not import, a
missing attribute, a value that is not a Restate Service, VirtualObject or Workflow (or a list of
them), or a service name used twice (also against Countersign's own names) raises a one-line
ServicesError naming `COUNTERSIGN_SERVICES` (a CountersignError, and a ValueError), before anything is
served. Services given to `create_app(services=...)` are checked the same way, the error naming `services`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence

import restate

from countersign.exceptions import ServicesError as ServicesError
from countersign.settings import Settings

RestateService = restate.Service | restate.VirtualObject | restate.Workflow
SETTING = "COUNTERSIGN_SERVICES"


def countersign_services() -> list[RestateService]:
    from countersign.agent.run import agent_run
    from countersign.approval.grants import grants, grants_given
    from countersign.approval.workflow import approval
    from countersign.channels.slack_messages import slack_messages
    from countersign.events.delivery import webhook_delivery, webhook_events, webhook_log
    from countersign.objects.audit import approval_audit
    from countersign.objects.bookkeeping import bookkeeping
    from countersign.objects.delivery import email_delivery
    from countersign.objects.inbox import approval_inbox
    from countersign.objects.resend_events import resend_webhook
    from countersign.objects.trust import tool_stats, trust_ramp

    return [
        agent_run,
        approval,
        grants,
        grants_given,
        approval_inbox,
        approval_audit,
        bookkeeping,
        tool_stats,
        trust_ramp,
        email_delivery,
        resend_webhook,
        webhook_events,
        webhook_delivery,
        webhook_log,
        slack_messages,
    ]


def load(spec: str) -> list[RestateService]:
    """The service(s) at `package.module:ATTR` (the format is checked by Settings)."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _refused(f"cannot import {module_name!r} (from {spec!r}): {exc}") from None
    except Exception as exc:  # the user's module failed while importing; say how, in one line
        raise _refused(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    if not hasattr(module, attr):
        raise _refused(f"module {module_name!r} has no attribute {attr!r} (from {spec!r})")
    try:
        return _as_services(getattr(module, attr))
    except ServicesError as exc:
        raise _refused(f"{spec} {exc}") from None


def _refused(problem: str) -> ServicesError:
    return ServicesError(f"{SETTING}: {problem}", setting=SETTING)


def user_services(settings: Settings) -> list[RestateService]:
    """The services COUNTERSIGN_SERVICES names, in order."""
    return [service for spec in settings.countersign_services for service in load(spec)]


def _as_services(value: object) -> list[RestateService]:
    items: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    services = [item for item in items if isinstance(item, RestateService)]
    if len(services) < len(items) or not items:
        found = next((type(i).__name__ for i in items if not isinstance(i, RestateService)), "an empty list")
        raise ServicesError(f"is not a restate Service, VirtualObject or Workflow or a list of them ({found})")
    return services


def endpoint_services(settings: Settings, extra: Sequence[object] = ()) -> list[RestateService]:
    """Countersign's services, those named by COUNTERSIGN_SERVICES, then `extra` (create_app's)."""
    served = countersign_services()
    _add(served, user_services(settings), SETTING)
    try:
        extra_services = _as_services(list(extra)) if extra else []
    except ServicesError as exc:
        raise ServicesError(f"create_app(services=...): a value {exc}") from None
    _add(served, extra_services, "create_app(services=...)")
    return served


def _add(served: list[RestateService], new: Iterable[RestateService], source: str) -> None:
    for service in new:
        if any(s.name == service.name for s in served):
            raise ServicesError(
                f"{source}: a service named {service.name!r} is already served by this endpoint",
                setting=SETTING if source == SETTING else None,
            )
        served.append(service)
