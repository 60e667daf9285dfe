"""Operator commands behind the CLI: pending, show, reassign, cancel, inbox revoke, audit
export/verify, stats.

Guarantee: read paths use Restate's admin SQL and read-only handlers; write paths go only through
the workflows' and objects' own handlers (`reassign`, `cancel`, `ApprovalInbox.revoke_links`), so an
operator can never bypass the rules a run enforces. Every failure is an `OperationError` with a
message for people, never a traceback. Journal values are opened with `COUNTERSIGN_JOURNAL_KEYS`, else
the dev stack's key (`.restate/`, see countersign.runtime.devstack); a sealed value without a key, or one the key
cannot open, is an error naming `COUNTERSIGN_JOURNAL_KEYS`, and `reassign` / `cancel` check the key on
the run before they write.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import restate

from countersign.approval.grants import GRANTS_QUERY, GRANTS_SERVICE, Grant
from countersign.approval.run_state import RUN_STATES_QUERY, RunState, runs_of
from countersign.contract import EMAIL_PATTERN, CancelRequest, ReassignRequest
from countersign.exceptions import CountersignError
from countersign.objects.audit import AuditLog, ChainedEntry, verify
from countersign.ops.dial import DialRefused, graduate, table_in, tighten, write
from countersign.ops.fatigue import Fatigue, fatigue
from countersign.runtime.devstack import NO_JOURNAL_KEYS, journal_keys
from countersign.security.codec import ENVELOPE, JournalCipher, JournalValueUnreadable
from countersign.settings import Settings
from countersign.tools.registry import Tool, load_tools

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class OperationError(Exception):
    pass


def seconds(text: str) -> int:
    """`45s`, `30m`, `2h`, `7d` → seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise OperationError(f"{text!r} is not a duration like 45s, 30m, 2h or 7d")
    return int(match.group(1)) * _UNIT[match.group(2)]


class Operations:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        keys = journal_keys(settings)
        self.codec = JournalCipher(keys, compress=settings.countersign_journal_compress) if keys else None

    def _sql(self, query: str) -> list[dict[str, Any]]:
        try:
            reply = httpx.post(
                f"{self.settings.restate_admin_url}/query",
                json={"query": query},
                headers={"accept": "application/json"},
                timeout=30,
            )
        except httpx.HTTPError as exc:
            raise OperationError(f"Restate admin API unreachable at {self.settings.restate_admin_url}: {exc}") from None
        if reply.status_code != 200:
            raise OperationError(f"Restate admin query failed ({reply.status_code}): {reply.text[:300]}")
        rows: list[dict[str, Any]] = reply.json()["rows"]
        return rows

    def _call(self, service: str, key: str | None, handler: str, body: object | None) -> Any:
        async def call() -> bytes:
            ingress = self.settings.restate_ingress_url
            async with restate.create_client(ingress, journal_value_codec=self.codec) as client:
                raw = json.dumps(body).encode() if body is not None else b""
                headers = {"content-type": "application/json"} if body is not None else None
                return await client.generic_call(service, handler, raw, key=key, headers=headers)

        what = f"{service}/{handler}"
        try:
            answer = self._opened(asyncio.run(call()), what)
        except restate.HttpError as exc:
            raise OperationError(f"{what} refused: {_message(exc.body)}") from None
        except httpx.HTTPError as exc:
            raise OperationError(f"Restate ingress unreachable at {self.settings.restate_ingress_url}: {exc}") from None
        except JournalValueUnreadable as exc:
            raise OperationError(_unreadable(what, exc)) from None
        try:
            return json.loads(answer or b"null")
        except ValueError:
            raise OperationError(f"{what} answered something that is not JSON") from None

    def runs(self) -> list[RunState]:
        """Every run with its approvals (without its actions, which no operator command reads here)."""
        rows = self._sql(RUN_STATES_QUERY)
        try:
            return runs_of(rows, lambda value: self._opened(value, "run state"))
        except ValueError as exc:  # pydantic's ValidationError: state this version cannot read
            raise OperationError(f"run state unreadable: {str(exc).splitlines()[0]}") from None

    def _opened(self, value: bytes, what: str) -> bytes:
        """A value as stored or answered: sealed when the journal is encrypted (see countersign.security.codec)."""
        if self.codec is None:
            if value.lstrip().startswith(ENVELOPE):
                raise OperationError(f"{what} is sealed (journal encryption) and {NO_JOURNAL_KEYS}")
            return value
        try:
            return self.codec.open(value)
        except JournalValueUnreadable as exc:
            raise OperationError(_unreadable(what, exc)) from None

    def pending(
        self, *, approver: str | None = None, tool: str | None = None, older_than: int | None = None, now: float
    ) -> list[dict[str, Any]]:
        found = []
        for run in self.runs():
            for record in run.approvals.values():
                deciding = [record.approvers[s] for s in record.active_slots]
                age = now - record.requested_at
                if record.state != "pending" or (approver and approver.lower() not in deciding):
                    continue
                if (tool and record.tool != tool) or (older_than is not None and age < older_than):
                    continue
                found.append(
                    {
                        "approval_id": record.approval_id,
                        "run_id": record.run_id,
                        "tenant": record.tenant,
                        "tool": record.tool,
                        "summary": record.summary,
                        "approvers": deciding,
                        "round": record.round,
                        "age_seconds": round(age),
                        "left_seconds": round(record.deadline - now),
                        "model": run.model,
                    }
                )
        return sorted(found, key=lambda row: -row["age_seconds"])

    def show(self, run_id: str) -> dict[str, Any]:
        """An agent run, or an approval by its id: one a gate in your own handler asked belongs to no
        run of `AgentRun`, and its own workflow answers in the same shape."""
        status = self._call("AgentRun", run_id, "status", None)
        if status.get("phase") == "unknown":
            status = self._call("Approval", run_id, "status", None)
        if status.get("phase") == "unknown":
            # A gate in your own handler keys its approvals `<run_id>-a<index>`: name them, since the
            # run id is what its caller knows.
            asked = sorted(a for run in self.runs() if run.run_id == run_id for a in run.approvals)
            if asked:
                raise OperationError(
                    f"{run_id} is not a run of AgentRun; its approvals (show one by its id): {', '.join(asked)}"
                )
            raise OperationError(f"no run or approval {run_id}")
        status["audit"] = {a["approval_id"]: self.audit_log(a["approval_id"]) for a in status["approvals"]}
        status["webhooks"] = self._call("WebhookLog", status["run_id"], "outcomes", None)["outcomes"]
        return dict(status)

    def _known(self, service: str, key: str) -> bool:
        """Whether `service/key` (`AgentRun` or `Approval`) has state, read from its read-only status."""
        return bool(self._call(service, key, "status", None).get("phase") != "unknown")

    def _check_keys(self, run_id: str) -> None:
        """Open the run's (read-only) status before a write: a missing or wrong key stops here, not
        after the handler has acted on a request it could read but whose answer we cannot."""
        self._known("AgentRun", run_id)

    def reassign(self, approval_id: str, to: str, replacing: str | None, reason: str, by: str) -> dict[str, Any]:
        self._check_keys(run_of(approval_id))
        request = ReassignRequest(approval_id=approval_id, to=to, replacing=replacing, reason=reason, by=by)
        return dict(self._call("Approval", approval_id, "reassign", request.model_dump()))

    def cancel(self, run_id: str, reason: str, by: str | None = None) -> dict[str, Any]:
        """Cancel an agent run (its pending approvals with it), or one approval by its id: one that a
        gate in your own handler asked, which no run of `AgentRun` holds. An id that is neither is
        answered by `AgentRun.cancel` as before (not accepted). `by` is named in the audit trail.
        The first read also checks the key."""
        if not self._known("AgentRun", run_id) and self._known("Approval", run_id):
            return self._cancel("Approval", run_id, reason, by)
        return self._cancel("AgentRun", run_id, reason, by)

    def _cancel(self, service: str, key: str, reason: str, by: str | None) -> dict[str, Any]:
        return dict(self._call(service, key, "cancel", CancelRequest(reason=reason, by=by).model_dump()))

    def cancel_older_than(self, limit: int, reason: str, now: float, by: str | None = None) -> list[dict[str, Any]]:
        """Every agent run with an approval waiting longer than `limit`, and every such approval that
        a gate in your own handler asked (your handler hears `cancelled` and goes on as it decides)."""
        stale = self.pending(older_than=limit, now=now)
        receipts = []
        for run_id in sorted({row["run_id"] for row in stale}):
            if self._known("AgentRun", run_id):
                receipts.append(self._cancel("AgentRun", run_id, reason, by))
                continue
            for approval_id in sorted(row["approval_id"] for row in stale if row["run_id"] == run_id):
                receipts.append(self._cancel("Approval", approval_id, reason, by))
        return receipts

    def inbox_revoke(self, approver: str) -> dict[str, Any]:
        """Every inbox link issued to `approver` until now stops working (approval links do not: reassign)."""
        if not re.fullmatch(EMAIL_PATTERN, approver):
            raise OperationError(f"{approver!r} is not an email address")
        return dict(self._call("ApprovalInbox", approver.lower(), "revoke_links", None))

    def grants(self, tool: str | None = None) -> list[Grant]:
        """Every standing approval (live, expired, used up or revoked), oldest first."""
        found = []
        for row in self._sql(GRANTS_QUERY):
            if not row.get("value_utf8"):
                continue
            try:
                grant = Grant.model_validate_json(self._opened(row["value_utf8"].encode(), "grant"))
            except ValueError as exc:
                raise OperationError(f"grant state unreadable: {str(exc).splitlines()[0]}") from None
            if tool is None or grant.tool == tool:
                found.append(grant)
        return sorted(found, key=lambda g: g.granted_at)

    def grant_revoke(self, grant_id: str, by: str) -> dict[str, Any]:
        """Revoke a standing approval: it covers no call asked after this."""
        kept = next((g for g in self.grants() if g.grant_id == grant_id), None)
        if kept is None:
            raise OperationError(f"no standing approval {grant_id!r}")
        return dict(self._call(GRANTS_SERVICE, kept.key, "revoke", {"grant_id": grant_id, "by": by}))

    def audit_log(self, approval_id: str) -> list[dict[str, Any]]:
        log = AuditLog.model_validate(self._call("ApprovalAudit", approval_id, "entries", None))
        return [e.model_dump(mode="json") for e in log.entries]

    def audit_export(self, run_id: str | None = None) -> Iterator[str]:
        for run in self.runs():
            if run_id and run.run_id != run_id:
                continue
            for approval_id in sorted(run.approvals):
                for entry in self.audit_log(approval_id):
                    yield json.dumps(entry, sort_keys=True, separators=(",", ":"))

    def audit_verify(self, lines: Iterable[str], live: bool) -> list[str]:
        chains: dict[str, list[ChainedEntry]] = {}
        problems = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = ChainedEntry.model_validate_json(line)
            except ValueError:
                problems.append(f"line {number}: not an audit entry")
                continue
            chains.setdefault(entry.approval_id, []).append(entry)
        if not chains and not problems:
            return ["no audit entries in the input: nothing was verified"]
        for approval_id, entries in sorted(chains.items()):
            problems += verify(entries)
            if live:
                stored = self.audit_log(approval_id)
                if not stored or stored[-1]["hash"] != entries[-1].hash or len(stored) != len(entries):
                    problems.append(f"{approval_id}: the export does not end where Restate's chain ends (truncated?)")
        return problems

    def stats(self) -> dict[str, Any]:
        return dict(self._call("TrustRamp", None, "report", None))

    def dial(
        self, direction: Literal["graduate", "tighten"], tool: str, when: str | None, out: Path | None, force: bool
    ) -> dict[str, Any]:
        """The policy change of `graduate` / `tighten`, written to `out` if given. The current table is
        `out`'s when it exists, else APPROVALS_POLICY_FILE's. `graduate` asks the trust ramp first."""
        code = _code_tool(self.settings, tool)
        table = table_in(out if out is not None and out.exists() else self.settings.approvals_policy_file, tool)
        if direction == "graduate" and not force:
            figures = next((t for t in self.stats()["tools"] if t.get("tool") == tool), None)
            if not figures or not figures.get("graduation_hint"):
                decided = figures.get("human_decisions", 0) if figures else 0
                raise OperationError(
                    f"the trust ramp has not suggested graduating {tool} ({decided} human decisions so far); "
                    "pass --force to turn the dial anyway"
                )
        try:
            change = (graduate if direction == "graduate" else tighten)(code, table, when)
            if out is not None:
                write(out, change)
        except DialRefused as exc:
            raise OperationError(str(exc)) from None
        except OSError as exc:
            raise OperationError(f"{out}: {exc.strerror or exc}") from None
        return {
            "tool": tool,
            "summary": change.summary,
            "policy_version_before": change.before,
            "policy_version_after": change.after,
            "table": change.table,
            "toml": change.toml(),
            "written": str(out) if out is not None else None,
        }

    def fatigue(self, reading_seconds: float, streak: int) -> Fatigue:
        """Whether approvers still read, from every approval's audit trail (one read per approval),
        with the trails of the calls standing approvals covered (counted apart: `grant_uses`)."""
        entries = (entry for run in self.runs() for a in sorted(run.approvals) for entry in self.audit_log(a))
        covered = sorted({"-a".join(use.rsplit("/", 1)) for grant in self.grants() for use in grant.used_by})
        granted = (entry for trail in covered for entry in self.audit_log(trail) if entry["kind"] == "granted")
        return fatigue(itertools.chain(entries, granted), reading_seconds=reading_seconds, streak_warning=streak)


def _code_tool(settings: Settings, name: str) -> Tool:
    """The tool as its code defines it (the policy file not applied)."""
    from countersign.tools import DEMO_TOOLS

    try:
        tools = load_tools(list(settings.countersign_tools) or [DEMO_TOOLS])
    except CountersignError as exc:
        raise OperationError(str(exc)) from None
    found = next((t for t in tools if t.name == name), None)
    if found is None:
        raise OperationError(f"no tool {name!r} is loaded (loaded: {', '.join(sorted(t.name for t in tools))})")
    return found


def run_of(approval_id: str) -> str:
    run_id, sep, index = approval_id.rpartition("-a")
    if not sep or not index.isdigit() or not run_id:
        raise OperationError(f"{approval_id!r} is not an approval id (they look like <run id>-a<number>)")
    return run_id


def _unreadable(what: str, exc: JournalValueUnreadable) -> str:
    hint = "" if "COUNTERSIGN_JOURNAL_KEYS" in str(exc) else " (is COUNTERSIGN_JOURNAL_KEYS the handlers' key?)"
    return f"{what}: {exc}{hint}"


def _message(body: str | None) -> str:
    try:
        return str(json.loads(body or "").get("message") or body)
    except (ValueError, AttributeError):
        return str(body)


def read_lines(path: Path | None) -> Iterable[str]:
    if path is None:
        return sys.stdin
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise OperationError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
