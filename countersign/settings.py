"""The one typed settings object, read from the environment once at startup.

Guarantee: a bad value is refused when the settings are read, with a message naming the variable
(a pydantic ValidationError from `Settings()`; a SettingsError from the checks below), and the console
commands stop at start with that one line; nothing else in the package reads `os.environ`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from countersign.contract import EMAIL_PATTERN, NAME_PATTERN
from countersign.exceptions import SettingsError

SigningKeys = Annotated[dict[str, bytes], NoDecode]
_DOMAIN = re.compile(r"^@[a-z0-9-]{1,63}(\.[a-z0-9-]{1,63})*\.[a-z]{2,24}\Z")
_TOOLS_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z")
_IDENTITY_KEY = re.compile(r"^publickeyv1_[1-9A-HJ-NP-Za-km-z]{32,64}\Z")
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")
_SERVICE_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*\Z")
WebhookEventType = Literal[
    "approval.requested", "approval.decided", "action.executed", "run.finished", "grant.created", "grant.revoked"
]
WEBHOOK_EVENT_TYPES: tuple[WebhookEventType, ...] = (
    "approval.requested",
    "approval.decided",
    "action.executed",
    "run.finished",
    "grant.created",
    "grant.revoked",
)
ALL_TENANTS = "*"
"""A COUNTERSIGN_WEBHOOKS key whose endpoints receive the events of every tenant."""
SHARED_LISTENER = "shared"
"""RESTATE_ENDPOINT_BIND value that serves the Restate endpoint on the pages' port (one-port platforms)."""


class WebhookEndpoint(BaseModel):
    """One receiver of signed outbound webhooks (an entry of COUNTERSIGN_WEBHOOKS)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://[^\s/?#]+[^\s]*$", max_length=2000)
    secret: SecretStr
    """The Standard Webhooks `whsec_<base64>` secret the receiver verifies signatures with."""
    events: tuple[WebhookEventType, ...] = WEBHOOK_EVENT_TYPES
    name: str = Field(default="", pattern=r"^([a-z0-9][a-z0-9_-]{0,39})?$")
    """Stable id of the endpoint (deliveries in flight find it by name); default: from the URL."""

    @field_validator("secret")
    @classmethod
    def _whsec(cls, secret: SecretStr) -> SecretStr:
        raw = secret.get_secret_value()
        try:
            decoded = base64.b64decode(raw.removeprefix("whsec_"), validate=True) if raw.startswith("whsec_") else b""
        except binascii.Error:
            decoded = b""
        if not 24 <= len(decoded) <= 64:
            raise ValueError("a secret must be whsec_ followed by 24 to 64 bytes in base64")
        return secret

    @property
    def id(self) -> str:
        return self.name or "url-" + hashlib.sha256(self.url.encode()).hexdigest()[:10]


WebhookEndpoints = Annotated[dict[str, tuple[WebhookEndpoint, ...]], NoDecode]


def parse_webhooks(raw: object) -> dict[str, tuple[WebhookEndpoint, ...]]:
    """COUNTERSIGN_WEBHOOKS: a JSON object, or the path of a .toml or .json file holding one, mapping a
    tenant (or `*`) to a list of `{url, secret, events?, name?}`. ValueError naming the problem."""
    if isinstance(raw, dict):
        data: Any = raw
    else:
        text = str(raw or "").strip()
        if not text:
            return {}
        try:
            if text.startswith("{"):
                data = json.loads(text)
            else:
                path = Path(text)
                body = path.read_text(encoding="utf-8")
                data = tomllib.loads(body) if path.suffix == ".toml" else json.loads(body)
        except OSError as exc:
            raise ValueError(f"cannot read {text[:200]!r}: {exc.strerror}") from None
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"not valid JSON or TOML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("must map tenant names to lists of endpoints")
    endpoints: dict[str, tuple[WebhookEndpoint, ...]] = {}
    for tenant, items in data.items():
        if tenant != ALL_TENANTS and not re.fullmatch(NAME_PATTERN, str(tenant)):
            raise ValueError(f"{str(tenant)[:60]!r} is not a tenant name (or * for every tenant)")
        if not isinstance(items, list | tuple) or not items:
            raise ValueError(f"tenant {tenant!r}: give a non-empty list of endpoints")
        try:
            parsed = tuple(WebhookEndpoint.model_validate(item) for item in items)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "endpoint"
            raise ValueError(f"tenant {tenant!r}: {where}: {first['msg'].removeprefix('Value error, ')}") from None
        ids = [e.id for e in parsed]
        if len(set(ids)) != len(ids):
            raise ValueError(f"tenant {tenant!r}: two endpoints have the same name or URL")
        endpoints[str(tenant)] = parsed
    return endpoints


class Settings(BaseSettings):
    """Every setting, read from the environment (the variable is the field's name in capitals).

    Each field's `description` is the documentation of that setting (the docs' settings reference is
    generated from it, and the docs build fails on a field without one); `json_schema_extra`'s
    `production` says when a production deployment must set it."""

    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    countersign_env: Literal["dev", "test", "production"] = Field(
        default="production",
        description="`dev` / `test` relax production-only checks: `serve` starts without `RESTATE_IDENTITY_KEYS` "
        "or `COUNTERSIGN_JOURNAL_KEYS` and says so in one warning line each (`countersign dev` generates both); "
        "`dev` alone also serves the demo tools when no tools are named. Only in dev/test does the outbox "
        "log the approval links it writes.",
    )
    restate_ingress_url: str = Field(
        default="http://127.0.0.1:8080",
        description="The Restate ingress: where the pages, the webhook route and the operator commands call "
        "Countersign's services.",
    )
    restate_admin_url: str = Field(
        default="http://127.0.0.1:9070",
        description="The Restate admin API, which the operator commands query (`pending`, `cancel --older-than`, "
        "`audit verify`).",
    )
    approvals_public_url: str = Field(
        default="http://127.0.0.1:9080",
        description="Base of the links in emails; a page's POST must come from this origin.",
    )
    # The Restate endpoint's own listener (HOST:PORT, or `shared`: on the pages' port, with the
    # Restate limits for both) and the public listener's timeouts; see countersign/runtime/hypercorn.toml.
    restate_endpoint_bind: str = Field(
        default="127.0.0.1:9081",
        pattern=rf"^({SHARED_LISTENER}|[\w.\[\]:-]+:\d{{1,5}})$",
        description="`HOST:PORT` of the Restate endpoint's own listener (register `http://HOST:PORT/restate`), "
        "or `shared`: on `serve --bind`, with the Restate limits for the pages too (one-port platforms; the "
        "`Dockerfile` sets it).",
    )
    pages_idle_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="Public listener: a connection with no request in progress, or still sending its request "
        "line and headers, is closed after this long.",
    )
    pages_read_timeout_seconds: int = Field(
        default=30,
        ge=1,
        le=600,
        description="Public listener: a connection on which nothing arrives for this long is closed (keep it "
        "above the slowest page answer: hypercorn counts that wait too).",
    )
    approvals_api_allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins (`https://admin.example.com`, comma-separated) whose browser pages may call the "
        "approver JSON API (`/api/v1/…`) across origins (CORS); empty, the default: only the pages' own origin "
        "and clients that send no `Origin` (servers).",
    )
    pages_body_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="A page or webhook request whose body is not complete this long after it started gets 408 "
        "and its connection is closed.",
    )
    approvals_signing_keys: SigningKeys = Field(
        default_factory=dict,
        description="`kid:secret[,kid:secret...]`, each secret at least 32 characters: the first signs new links, "
        "all verify (rotation). Links already sent stay valid only while their key is listed, so keep the "
        "value across restarts. `countersign dev` generates `.restate/dev-signing-keys`.",
        json_schema_extra={"production": "required (every process that serves or reads links)"},
    )
    approvals_outbox_dir: Path = Field(
        default=Path(".outbox"),
        description="Where each email is written as an `.eml` file when `RESEND_API_KEY` is unset.",
    )
    approvals_policy_file: Path | None = Field(
        default=None,
        description="A TOML file of per-tool policy overrides, `[tools.<name>]` tables for loaded tools: `gated`, "
        "`when` (a CEL condition, e.g. `amount_usd > 500`), `approvers`, `quorum`, `deadline_seconds` (at most 7 "
        "days), reminders, escalation, `high_stakes` / `high_stakes_when`, checkpoints (`gate_below_confidence`, "
        "`checks`), `on_model_retired`, `channels` / `approver_channels` / `slack_channel`, `plan`; read at start.",
    )
    countersign_tools: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="`package.module:ATTR[,...]`: the tools to load, each attribute a list of `Tool` or a "
        "`Registry`, imported from the current folder or `PYTHONPATH`. With `COUNTERSIGN_ENV=dev` and none "
        "named: the demo tools (in a checkout). None named beside `COUNTERSIGN_SERVICES`: no tools.",
        json_schema_extra={
            "production": "required, unless tools are given to `create_app(tools=...)` or "
            "`COUNTERSIGN_SERVICES` names handlers of your own"
        },
    )
    resend_api_key: str | None = Field(
        default=None, description="Send emails through Resend instead of writing them to the outbox."
    )
    resend_from: str = Field(
        default="Countersign <approvals@countersign.local>",
        description="The sender of every email (with Resend: on a domain verified there).",
    )
    resend_webhook_secret: str | None = Field(
        default=None,
        description="The Resend webhook's `whsec_...` signing secret; without it `POST /webhooks/resend` answers 503.",
    )
    resend_api_url: str | None = Field(
        default=None,
        description="Another Resend API base (the tests' local fake); unset: the SDK's `https://api.resend.com`.",
    )
    resend_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        le=50,
        description="Per-request timeout of the Resend SDK (at most 50, under Restate's 1 min inactivity timeout).",
    )
    slack_bot_token: SecretStr | None = Field(
        default=None,
        description="The Slack app's bot token (`xoxb-...`; scopes `chat:write`, `im:write`, `users:read`, "
        "`users:read.email`, and `channels:history`/`im:history` for the duplicate check) that posts and "
        "updates the approval messages.",
        json_schema_extra={"production": "required when a policy names `slack`"},
    )
    slack_signing_secret: SecretStr | None = Field(
        default=None,
        description="The Slack app's signing secret; verifies `POST /slack/interactions` (without it: 503).",
        json_schema_extra={"production": "required when a policy names `slack`"},
    )
    slack_api_base: str = Field(
        default="https://slack.com/api/", description="The Slack Web API base (the tests point it at a local fake)."
    )
    slack_timeout_seconds: float = Field(
        default=10.0, gt=0, le=30, description="Per-request timeout of the Slack SDK (at most 30)."
    )
    tool_context_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=30,
        description="A tool's `context` function (facts for the approver) is given up after this long; the "
        "approval goes out saying the facts could not be read.",
    )
    approvals_security_contact: str | None = Field(
        default=None,
        pattern=r"^[^@\s<>\"']{1,64}@[A-Za-z0-9.-]{1,190}$",
        description='Named in the decision receipt\'s "if this wasn\'t you" (else "your security team").',
    )
    restate_identity_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="`publickeyv1_...` keys, comma-separated: only a Restate server signing with one of them can "
        "invoke the endpoint. `countersign dev` generates a key pair.",
        json_schema_extra={"production": "required"},
    )
    countersign_journal_keys: SigningKeys = Field(
        default_factory=dict,
        description="`kid:base64key[,...]`, 32-byte AES-256 keys: the first encrypts journal values, all decrypt "
        "(rotation). The web tier and the operator commands need the same keys. Unset (dev/test only), "
        "journal values are stored in plaintext. `countersign dev` generates `.restate/dev-journal-keys`.",
        json_schema_extra={"production": "required"},
    )
    countersign_journal_compress: bool = Field(
        default=True,
        description="`false` seals every journal value uncompressed (`v1`); `v1` and `v2` always open. Only for "
        "the upgrade from a version that cannot open `v2` while it still has paused runs.",
    )
    countersign_services: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Your own Restate services served by the same endpoint: comma-separated "
        "`package.module:ATTR`, each a Service, VirtualObject or Workflow or a list of them, imported from "
        "the current folder or `PYTHONPATH`.",
    )
    model: str = Field(
        default="scripted",
        description="The model a run of the built-in agent uses unless its task names one: `scripted`, "
        "`openai:<model>`, `anthropic:<model>`.",
    )
    # The providers' own variables, passed to their SDKs explicitly.
    openai_api_key: SecretStr | None = Field(
        default=None, description="Key for `openai:` models (any value for a local server that needs none)."
    )
    openai_base_url: str | None = Field(
        default=None, description="Endpoint for `openai:` models (unset: OpenAI's); any Chat Completions server."
    )
    anthropic_api_key: SecretStr | None = Field(default=None, description="Key for `anthropic:` models.")
    anthropic_base_url: str | None = Field(
        default=None, description="Endpoint for `anthropic:` models (unset: Anthropic's)."
    )
    model_timeout_seconds: float = Field(
        default=60.0, gt=0, le=600, description="One provider request; a timeout is retried."
    )
    model_max_attempts: int = Field(
        default=5,
        ge=1,
        le=20,
        description="Attempts per model turn (429, 5xx, timeouts) before the run fails.",
    )
    model_max_malformed_turns: int = Field(
        default=3, ge=1, le=20, description="Malformed model replies in a row before the run fails."
    )
    model_max_tokens: int = Field(
        default=4096, ge=256, le=128_000, description="Reply length limit (Anthropic requires one)."
    )
    demo_db: Path = Field(
        default=Path(".demo/business.db"),
        description="The demo tools' SQLite database (created and seeded on first use).",
    )
    agent_max_turns: int = Field(default=20, ge=1, le=200, description="Bound on model turns per agent run.")
    trust_ramp_min_decisions: int = Field(
        default=20,
        ge=1,
        description="Human decisions (with no rejection and no edit) a tool needs before the trust ramp hints "
        "that it could run without approval.",
    )
    fatigue_reading_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="`stats`: a decision faster than this after the page was first opened counts as fast.",
    )
    fatigue_streak: int = Field(
        default=50,
        ge=1,
        le=100_000,
        description="`stats`: this many fast, unedited approvals in a row by one approver is a warning that they "
        "stopped reading.",
    )
    countersign_fault: str | None = Field(
        default=None,
        description="For the fault tests only: the crash, fail or delay point to arm; ignored unless "
        "`COUNTERSIGN_ENV=test`.",
    )
    approvals_reassign_allowed: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Whom `reassign` may hand an approval to besides each tool's approvers and escalation chain: "
        "addresses and `@domain` entries, comma-separated (`carol@example.com,@example.com`). Empty: only the "
        "policy's people.",
    )
    countersign_webhooks: WebhookEndpoints = Field(
        default_factory=dict,
        description="The outbound webhooks' endpoints per tenant: a JSON object, or the path of a `.toml` / "
        "`.json` file holding one, mapping a tenant (or `*`: every tenant) to a list of `{url, secret, events, "
        "name}` (`secret`: `whsec_` + 24-64 bytes in base64; `events`: default all four; `name`: `[a-z0-9_-]`, "
        "default derived from the URL). A bad value stops the process at start.",
    )
    countersign_webhook_attempts: int = Field(
        default=15, ge=1, le=50, description="Attempts per webhook event and endpoint before it is given up."
    )
    countersign_webhook_backoff_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="The wait after a webhook's first failed attempt, doubling (plus or minus 20 %) up to the "
        "maximum below; the defaults keep trying for about 24 h.",
    )
    countersign_webhook_backoff_max_seconds: float = Field(
        default=14400.0, gt=0, le=86400, description="The longest wait between two attempts of a webhook."
    )
    countersign_webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, le=60, description="One webhook POST (at most 60)."
    )
    # Observability (countersign/observability/): the metrics listener, the log format, and the
    # standard OpenTelemetry variables that switch traces on (the SDK reads the rest of OTEL_* itself).
    countersign_metrics_bind: str | None = Field(
        default=None,
        pattern=r"^[\w.\[\]:-]+:\d{1,5}$",
        description="HOST:PORT of a listener of its own serving Prometheus metrics on GET /metrics "
        "(never the pages' listener); unset: no metrics listener.",
    )
    countersign_metrics_cache_seconds: float = Field(
        default=15.0,
        ge=0,
        le=600,
        description="How long the approvals-waiting figures read from Restate's durable state are reused "
        "between scrapes (each read is one admin SQL query).",
    )
    countersign_log_format: Literal["text", "json"] = Field(
        default="text",
        description="`json`: one JSON object per log line (time, level, logger, message, invocation_id, "
        "approval_id); `text`: plain lines, the ids appended.",
    )
    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        description="OpenTelemetry's standard OTLP/HTTP base URL (spans go to <it>/v1/traces); set, it "
        "switches traces on. Needs the `tracing` extra.",
    )
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        default=None,
        description="OpenTelemetry's standard OTLP/HTTP URL for spans (used as is); set, it switches traces on.",
    )
    otel_service_name: str = Field(
        default="countersign", min_length=1, description="The service.name of the spans this process exports."
    )
    otel_sdk_disabled: bool = Field(
        default=False, description="OpenTelemetry's standard switch: true turns traces off whatever else is set."
    )

    @field_validator("approvals_signing_keys", mode="before")
    @classmethod
    def _parse_keys(cls, raw: object) -> dict[str, bytes]:
        if isinstance(raw, dict):
            return {str(k): v if isinstance(v, bytes) else str(v).encode() for k, v in raw.items()}
        keys: dict[str, bytes] = {}
        for item in str(raw or "").split(","):
            if not item.strip():
                continue
            kid, sep, secret = item.strip().partition(":")
            if not sep or not kid.isalnum() or len(kid) > 16:
                raise ValueError("APPROVALS_SIGNING_KEYS must be comma-separated kid:secret pairs")
            if len(secret) < 32:
                raise ValueError(f"signing key {kid!r} is shorter than 32 characters")
            if kid in keys:
                raise ValueError(f"signing key id {kid!r} appears twice")
            keys[kid] = secret.encode()
        return keys

    @field_validator("countersign_tools", mode="before")
    @classmethod
    def _parse_tools(cls, raw: object) -> tuple[str, ...]:
        if isinstance(raw, list | tuple):
            raw = ",".join(str(item) for item in raw)
        try:
            return parse_tools_spec(str(raw or ""))
        except ValueError as exc:
            raise ValueError(f"COUNTERSIGN_TOOLS: {exc} (e.g. COUNTERSIGN_TOOLS=mycompany.tools:TOOLS)") from None

    @field_validator("restate_identity_keys", mode="before")
    @classmethod
    def _parse_identity_keys(cls, raw: object) -> list[str]:
        items = [str(k) for k in raw] if isinstance(raw, list) else str(raw or "").split(",")
        keys = [k.strip() for k in items if k.strip()]
        for key in keys:
            if not _IDENTITY_KEY.match(key):
                raise ValueError(f"{key[:24]!r}... is not a Restate request identity key (publickeyv1_<base58>)")
        return keys

    @field_validator("countersign_services", mode="before")
    @classmethod
    def _parse_service_paths(cls, raw: object) -> list[str]:
        items = [str(k) for k in raw] if isinstance(raw, list) else str(raw or "").split(",")
        paths = [k.strip() for k in items if k.strip()]
        for path in paths:
            if not _SERVICE_PATH.match(path):
                raise ValueError(f"{path[:80]!r} is not package.module:ATTR (comma-separated for several)")
        return paths

    @field_validator("approvals_api_allowed_origins", mode="before")
    @classmethod
    def _parse_origins(cls, raw: object) -> list[str]:
        items = [str(k) for k in raw] if isinstance(raw, list) else str(raw or "").split(",")
        origins = [k.strip().rstrip("/") for k in items if k.strip()]
        for origin in origins:
            if not _ORIGIN.match(origin):
                raise ValueError(f"{origin[:80]!r} is not an origin: scheme://host[:port], no path (comma-separated)")
        return origins

    @field_validator("countersign_webhooks", mode="before")
    @classmethod
    def _parse_webhooks(cls, raw: object) -> dict[str, tuple[WebhookEndpoint, ...]]:
        return parse_webhooks(raw)

    def webhook_endpoints(self, tenant: str) -> tuple[WebhookEndpoint, ...]:
        """The endpoints that receive `tenant`'s events: its own, then those for every tenant."""
        own = self.countersign_webhooks.get(tenant, ())
        names = {e.id for e in own}
        return own + tuple(e for e in self.countersign_webhooks.get(ALL_TENANTS, ()) if e.id not in names)

    @field_validator("approvals_reassign_allowed", mode="before")
    @classmethod
    def _parse_reassign_allowed(cls, raw: object) -> list[str]:
        items = [str(k) for k in raw] if isinstance(raw, list) else str(raw or "").split(",")
        allowed = [item.strip().lower() for item in items if item.strip()]
        for item in allowed:
            if not (re.fullmatch(EMAIL_PATTERN, item) or _DOMAIN.match(item)):
                raise ValueError(f"{item[:60]!r} is neither an email address nor an @domain (e.g. @example.com)")
        return allowed

    @field_validator("countersign_journal_keys", mode="before")
    @classmethod
    def _parse_journal_keys(cls, raw: object) -> dict[str, bytes]:
        if isinstance(raw, dict):
            return {str(k): bytes(v) for k, v in raw.items()}
        return parse_journal_keys(str(raw or ""))

    @field_validator("openai_api_key", "anthropic_api_key", "openai_base_url", "anthropic_base_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, raw: object) -> object:
        return None if isinstance(raw, str) and not raw.strip() else raw

    @field_validator("openai_base_url", "anthropic_base_url")
    @classmethod
    def _provider_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return url

    @field_validator("otel_exporter_otlp_endpoint", "otel_exporter_otlp_traces_endpoint", mode="before")
    @classmethod
    def _otlp_url(cls, raw: object) -> object:
        if isinstance(raw, str) and not raw.strip():
            return None
        if isinstance(raw, str) and not raw.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL (traces go over OTLP/HTTP)")
        return raw

    @field_validator("approvals_public_url", "restate_ingress_url", "restate_admin_url", "resend_api_url")
    @classmethod
    def _strip_slash(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not url.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return url.rstrip("/")

    @field_validator("slack_api_base")
    @classmethod
    def _slack_base(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return url.rstrip("/") + "/"  # slack_sdk joins method names onto it

    @field_validator("resend_webhook_secret")
    @classmethod
    def _check_webhook_secret(cls, secret: str | None) -> str | None:
        if secret is None:
            return None
        try:
            decoded = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            decoded = b""
        if len(decoded) < 16:
            raise ValueError("must be the whsec_... signing secret of the Resend webhook (base64, >= 16 bytes)")
        return secret

    def may_reassign_to(self, address: str) -> bool:
        """Whether APPROVALS_REASSIGN_ALLOWED lists `address` or its domain."""
        address = address.lower()
        return address in self.approvals_reassign_allowed or "@" + address.rpartition("@")[2] in (
            self.approvals_reassign_allowed
        )

    @property
    def is_dev(self) -> bool:
        return self.countersign_env in ("dev", "test")

    @property
    def signing_kid(self) -> str:
        """The key that signs new links: the first one listed."""
        return next(iter(self.approvals_signing_keys))

    @property
    def journal_kid(self) -> str | None:
        """The key that encrypts new journal values: the first one listed (None: no encryption)."""
        return next(iter(self.countersign_journal_keys), None)


def parse_tools_spec(raw: str) -> tuple[str, ...]:
    """`package.module:ATTR[,package.module:ATTR...]`, each checked for form (ValueError otherwise)."""
    specs = tuple(s.strip() for s in raw.split(",") if s.strip())
    for spec in specs:
        if not _TOOLS_SPEC.match(spec):
            raise ValueError(f"{spec!r} is not package.module:ATTRIBUTE")
    if len(set(specs)) != len(specs):
        raise ValueError("the same module:attribute is listed twice")
    return specs


def parse_journal_keys(raw: str) -> dict[str, bytes]:
    """`kid:base64key[,kid:base64key...]` (32-byte AES keys; standard or URL-safe base64), in order."""
    keys: dict[str, bytes] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        kid, sep, encoded = item.strip().partition(":")
        if not sep or not kid.isalnum() or len(kid) > 16 or kid in keys:
            raise ValueError("COUNTERSIGN_JOURNAL_KEYS must be comma-separated kid:base64key pairs, distinct kids")
        standard = encoded.replace("-", "+").replace("_", "/")
        try:
            key = base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
        except binascii.Error:
            key = b""
        if len(key) != 32:
            raise ValueError(f"journal key {kid!r} must be 32 random bytes, base64-encoded (AES-256)")
        keys[kid] = key
    return keys


@functools.cache
def get_settings() -> Settings:
    return Settings()


def require_signing_keys(settings: Settings) -> None:
    if not settings.approvals_signing_keys:
        raise SettingsError(
            "APPROVALS_SIGNING_KEYS",
            "APPROVALS_SIGNING_KEYS is not set: give one or more kid:secret pairs (secret >= 32 chars), "
            "e.g. APPROVALS_SIGNING_KEYS=k1:$(python -c 'import secrets;print(secrets.token_urlsafe(32))')",
        )


def require_production_keys(settings: Settings) -> None:
    """Outside dev/test, refuse to serve an endpoint anyone can invoke or a journal in plaintext."""
    if settings.is_dev:
        return
    if not settings.restate_identity_keys:
        raise SettingsError(
            "RESTATE_IDENTITY_KEYS",
            "RESTATE_IDENTITY_KEYS is not set: without it anyone who can reach the endpoint can invoke it. "
            "Give the publickeyv1_... key of your Restate server (or set COUNTERSIGN_ENV=dev for local work).",
        )
    if not settings.countersign_journal_keys:
        raise SettingsError(
            "COUNTERSIGN_JOURNAL_KEYS",
            "COUNTERSIGN_JOURNAL_KEYS is not set: journal values (arguments, emails) would be stored in plaintext. "
            "Give kid:base64key pairs of 32 random bytes, e.g. COUNTERSIGN_JOURNAL_KEYS=j1:$(openssl rand -base64 32)",
        )
