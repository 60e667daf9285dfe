"""Checks run once before serving: a start with bad configuration is refused.

Guarantee: missing signing keys, an unreadable policy file, tools that do not load
(COUNTERSIGN_TOOLS), no tools named outside dev, an unknown default model, an unwritable outbox or a
`COUNTERSIGN_SERVICES` entry that cannot be served raise a one-line CountersignError
(countersign.exceptions) before any request is accepted; so do missing request identity keys or
journal keys outside dev/test (an endpoint anyone could invoke, a journal in plaintext), or traces
asked for (an OTEL_EXPORTER_OTLP_* endpoint) without OpenTelemetry installed. `serve`
prints that line and exits. In dev/test, running without the keys is allowed and said in one
warning line each.
"""

from __future__ import annotations

import logging

from countersign.channels import missing_slack_setting, uses_slack
from countersign.exceptions import SettingsError
from countersign.llm import ModelUnavailable, check_model
from countersign.observability import logs, tracing
from countersign.runtime.services import SETTING, endpoint_services, user_services
from countersign.settings import Settings, require_production_keys, require_signing_keys
from countersign.tools import use_tools
from countersign.tools.registry import Registry

log = logging.getLogger("countersign.runtime.startup")


def configure_logging(settings: Settings | None = None) -> None:
    """Log lines (COUNTERSIGN_LOG_FORMAT: text or json) naming the invocation and approval that wrote them."""
    logs.configure(settings.countersign_log_format if settings is not None else "text")
    for noisy in ("restate", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def require_slack(settings: Settings, tools: Registry) -> None:
    """A policy that names Slack needs the bot token (to post) and the signing secret (to take clicks)."""
    named = [name for name in tools.names() if (tool := tools.get(name)) and uses_slack(tool.policy)]
    if not named:
        return
    if (setting := missing_slack_setting(settings)) is not None:
        raise SettingsError(
            setting, f"{setting} is not set: the policy of {', '.join(named)} sends approvals through Slack"
        )


def require_tracing(settings: Settings) -> None:
    """Traces asked for (an OTLP endpoint set) need the `tracing` extra installed."""
    if not tracing.enabled(settings):
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        setting = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
            if settings.otel_exporter_otlp_traces_endpoint
            else "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        raise SettingsError(
            setting,
            f"{setting} is set but OpenTelemetry is not installed: pip install 'countersign-approvals[tracing]'",
        ) from None


def warn_relaxed(settings: Settings) -> None:
    """What dev/test lets through that production refuses, so nobody mistakes it for protection."""
    if not settings.is_dev:
        return
    if not settings.restate_identity_keys:
        log.warning(
            "RESTATE_IDENTITY_KEYS is not set: the Restate endpoint accepts unsigned requests "
            "(allowed because COUNTERSIGN_ENV=%s)",
            settings.countersign_env,
        )
    if not settings.countersign_journal_keys:
        log.warning(
            "COUNTERSIGN_JOURNAL_KEYS is not set: journal values (arguments, emails) are stored in plaintext "
            "(allowed because COUNTERSIGN_ENV=%s)",
            settings.countersign_env,
        )


def check(settings: Settings) -> None:
    """Every check of the module's guarantee, in order; the first problem is raised. The tools are the
    process's (those an earlier `create_app(tools=...)` set, else built from `settings` and kept)."""
    require_signing_keys(settings)
    try:
        check_model(settings.model)
    except ModelUnavailable as exc:
        raise SettingsError("MODEL", f"MODEL: {exc}") from None
    if not settings.resend_api_key:
        try:
            settings.approvals_outbox_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SettingsError(
                "APPROVALS_OUTBOX_DIR", f"APPROVALS_OUTBOX_DIR {settings.approvals_outbox_dir}: {exc}"
            ) from None
    require_production_keys(settings)
    require_tracing(settings)
    tools = use_tools(settings)
    require_slack(settings, tools)
    endpoint_services(settings)
    # Only once everything checked out, so that a refusal is the one line the process prints.
    warn_relaxed(settings)
    log.info("tools: %s: %s", tools.source, ", ".join(tools.names()) or "none")
    if settings.countersign_services:
        own = ", ".join(service.name for service in user_services(settings))
        log.info("services: %s=%s: %s", SETTING, ",".join(settings.countersign_services), own)
