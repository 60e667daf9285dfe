"""Command line: `python -m countersign dev | serve | pending | show | reassign | cancel | inbox | audit | stats |
decode`.

Guarantee: bad arguments print a usage error (exit 2), refused or failed operations and a
configuration the library refuses (any CountersignError, e.g. `serve` at start) a one-line reason
(exit 1); never a traceback. `--json` gives scripts the same facts the tables show people.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from countersign.exceptions import CountersignError

if TYPE_CHECKING:
    from countersign.ops.operations import Operations


def _bind(value: str) -> str:
    if not re.match(r"^[\w.\[\]:-]+:\d{1,5}$", value):
        raise argparse.ArgumentTypeError("expected HOST:PORT, e.g. 127.0.0.1:9080")
    return value


def _email(value: str) -> str:
    from countersign.contract import EMAIL_PATTERN  # what the handlers accept, so a refusal is a usage error

    if not re.fullmatch(EMAIL_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an email address")
    return value


def _asker(value: str) -> str:
    if not 1 <= len(value.strip()) <= 200:
        raise argparse.ArgumentTypeError("--by takes 1-200 characters naming who asks")
    return value.strip()


def _operator() -> str:
    """Who runs the CLI, as the login name says (the default of `reassign --by` and `cancel --by`)."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        return "cli"


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return int(value)


def _duration(value: str) -> int:
    from countersign.ops.operations import OperationError, seconds

    try:
        return seconds(value)
    except OperationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="countersign", description="Countersign: emailed approval for agents.")
    commands = root.add_subparsers(dest="command", required=True)
    dev = commands.add_parser("dev", help="run restate-server, the handlers and registration locally")
    dev.add_argument("--demo", action="store_true", help="also start one demo run (a $612.40 refund)")
    serve = commands.add_parser(
        "serve", help="serve the handlers only (for deployment); the Restate endpoint on RESTATE_ENDPOINT_BIND"
    )
    serve.add_argument(
        "--bind", type=_bind, default="127.0.0.1:9080", help="HOST:PORT of the pages (default 127.0.0.1:9080)"
    )

    pending = commands.add_parser("pending", help="approvals waiting for a decision, oldest first")
    pending.add_argument("--approver", type=_email)
    pending.add_argument("--tool")
    pending.add_argument("--older-than", type=_duration, metavar="AGE", help="e.g. 2h, 7d")
    show = commands.add_parser(
        "show",
        help="one run, or one approval by its id (asked from your own handler): phase, approvals, history, audit",
    )
    show.add_argument("run_id")
    reassign = commands.add_parser("reassign", help="hand a pending approval to someone else (old links die)")
    reassign.add_argument("approval_id")
    reassign.add_argument("--to", type=_email, required=True)
    reassign.add_argument("--from", dest="replacing", type=_email, help="whom to replace, when several decide")
    reassign.add_argument("--reason", default="")
    reassign.add_argument("--by", type=_asker, default=None, help="who asks, for the audit trail (default: cli:$USER)")
    cancel = commands.add_parser(
        "cancel", help="cancel a run or an approval (by its id), or every one waiting longer than --older-than"
    )
    cancel.add_argument("run_id", nargs="?")
    cancel.add_argument("--older-than", type=_duration, metavar="AGE")
    cancel.add_argument("--reason", required=True)
    cancel.add_argument("--by", type=_asker, default=None, help="who asks, for the audit trail (default: cli:$USER)")
    inbox = commands.add_parser("inbox", help="an approver's inbox links")
    inbox_commands = inbox.add_subparsers(dest="inbox_command", required=True)
    revoke = inbox_commands.add_parser(
        "revoke", help="every inbox link issued to this approver until now stops working (newer ones work)"
    )
    revoke.add_argument("approver", type=_email)
    grants = commands.add_parser("grants", help="standing approvals: list them, or revoke one")
    grants_commands = grants.add_subparsers(dest="grants_command", required=True)
    listed = grants_commands.add_parser("list", help="every standing approval, with its uses and state")
    listed.add_argument("--tool")
    withdraw = grants_commands.add_parser("revoke", help="revoke a standing approval: it covers no call asked after")
    withdraw.add_argument("grant_id")
    withdraw.add_argument("--by", type=_asker, default=None, help="who revokes, for the record (default: cli:$USER)")
    audit = commands.add_parser("audit", help="export or verify the hash-chained audit trail")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    export = audit_commands.add_parser("export", help="JSON Lines of every audit entry")
    export.add_argument("--run", dest="run_id")
    export.add_argument("--out", type=Path)
    check = audit_commands.add_parser("verify", help="detect changed, removed or reordered entries")
    check.add_argument("file", type=Path, nargs="?", help="an export (default: standard input)")
    check.add_argument("--offline", action="store_true", help="check the chains only, not against Restate")
    stats = commands.add_parser(
        "stats", help="the trust ramp and whether approvers still read: per-tool and per-approver figures"
    )
    stats.add_argument(
        "--reviewers", action="store_true", help="only the per-approver figures (with --json: a list of approvers)"
    )
    stats.add_argument(
        "--reading-time",
        type=_duration,
        metavar="AGE",
        help="a decision faster than this after opening the page is fast (default FATIGUE_READING_SECONDS, 5s)",
    )
    stats.add_argument(
        "--streak",
        type=_positive,
        metavar="N",
        help="warn after N fast approvals in a row with no edit or rejection (default FATIGUE_STREAK, 50)",
    )
    dials = []
    for direction, what in (("graduate", "run without approval"), ("tighten", "need approval again")):
        dial = commands.add_parser(
            direction, help=f"print (or --write) the policy change that makes a tool's calls {what}"
        )
        dial.add_argument("tool")
        dial.add_argument("--when", metavar="EXPR", help=f"only the calls where this CEL condition holds {what}")
        dial.add_argument("--write", dest="out", type=Path, metavar="FILE", help="write the change to this policy file")
        dials.append(dial)
    dials[0].add_argument("--force", action="store_true", help="even without the trust ramp's graduation hint")
    for sub in (pending, show, reassign, cancel, revoke, listed, withdraw, check, commands.choices["stats"], *dials):
        sub.add_argument("--json", action="store_true", help="machine-readable output")
    commands.add_parser(
        "decode",
        help="open a sealed journal value or ingress answer read from stdin (COUNTERSIGN_JOURNAL_KEYS, "
        "else the dev stack's key)",
    )
    return root


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. What the library refuses is one line on stderr and exit 1."""
    args = parser().parse_args(argv)
    try:
        return _command(args)
    except CountersignError as exc:
        print(" ".join(str(exc).split("\n")), file=sys.stderr)
        return 1


def _command(args: argparse.Namespace) -> int:
    if args.command == "dev":
        from countersign.runtime.devstack import run_dev

        return run_dev(args.demo)
    if args.command == "serve":
        return _serve(args.bind)
    if args.command == "cancel" and (args.run_id is None) == (args.older_than is None):
        parser().error("cancel takes a RUN_ID or --older-than, not both or neither")
    try:
        return _print_command(args)
    except BrokenPipeError:
        return _reader_gone()


def _print_command(args: argparse.Namespace) -> int:
    """`decode` and the operator commands: what they print goes to stdout, a refusal to stderr."""
    if args.command == "decode":
        from countersign.runtime.devstack import decode_stdin

        return decode_stdin()
    from countersign.ops.operations import OperationError

    try:
        return _operate(args)
    except OperationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _reader_gone() -> int:
    """Whoever read the output stopped early (`show RUN_ID | head`): end quietly, as Unix tools do.
    stdout now points at /dev/null, or Python would print a second traceback flushing it at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


def _serve(bind: str) -> int:
    from countersign.runtime import startup
    from countersign.runtime.server import listeners, serve
    from countersign.settings import get_settings

    settings = get_settings()
    startup.configure_logging(settings)
    startup.check(settings)
    asyncio.run(serve(*listeners(settings, bind)))
    return 0


def _operate(args: argparse.Namespace) -> int:
    from countersign.ops import show_view
    from countersign.ops.operations import Operations, read_lines
    from countersign.settings import get_settings

    ops = Operations(get_settings())
    if args.command == "pending":
        rows = ops.pending(approver=args.approver, tool=args.tool, older_than=args.older_than, now=time.time())
        return _out(args, rows, ["approval_id", "tool", "summary", "approvers", "age_seconds", "left_seconds"])
    if args.command == "show":
        status = ops.show(args.run_id)
        if args.json:
            return _out(args, status)
        print(show_view.render(status))
        return 0
    if args.command == "reassign":
        return _out(args, ops.reassign(args.approval_id, args.to, args.replacing, args.reason, args.by or _operator()))
    if args.command == "cancel":
        if args.run_id:
            return _out(args, ops.cancel(args.run_id, args.reason, args.by or _operator()))
        rows = ops.cancel_older_than(args.older_than, args.reason, time.time(), args.by or _operator())
        return _out(args, rows, ["run_id", "accepted", "cancelled_approvals"])
    if args.command == "inbox":
        return _out(args, ops.inbox_revoke(args.approver))
    if args.command == "grants":
        if args.grants_command == "revoke":
            return _out(args, ops.grant_revoke(args.grant_id, args.by or _operator()))
        rows = [_grant_row(g, time.time()) for g in ops.grants(args.tool)]
        return _out(args, rows, ["grant_id", "tool", "scope", "bounds", "uses", "granted_by", "state"])
    if args.command == "stats":
        return _stats(args, ops)
    if args.command in ("graduate", "tighten"):
        change = ops.dial(args.command, args.tool, args.when, args.out, getattr(args, "force", False))
        if args.json:
            return _out(args, change)
        sys.stdout.write(change["toml"])
        if change["written"]:
            print(
                f"written to {change['written']}; the handlers apply it once they restart with "
                f"APPROVALS_POLICY_FILE={change['written']}",
                file=sys.stderr,
            )
        return 0
    if args.audit_command == "export":
        lines = list(ops.audit_export(args.run_id))
        text = "".join(f"{line}\n" for line in lines)
        if args.out:
            args.out.write_text(text, encoding="utf-8")
            print(f"{len(lines)} entries written to {args.out}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0
    problems = ops.audit_verify(read_lines(args.file), live=not args.offline)
    if args.json:
        print(json.dumps({"ok": not problems, "problems": problems}))
    else:
        print("\n".join(problems) if problems else "audit trail intact")
    return 1 if problems else 0


def _grant_row(grant: Any, now: float) -> dict[str, Any]:
    return {
        **grant.model_dump(mode="json"),
        "scope": f"{grant.scope} {grant.scope_value}",
        "bounds": "; ".join(grant.bounds()),
        "uses": f"{grant.uses}/{grant.max_uses}",
        "state": grant.state(now),
    }


_TRUST_COLUMNS = [
    "tool",
    "total",
    "human_decisions",
    "approval_rate",
    "rejection_rate",
    "edit_rate",
    "expiry_rate",
    "median_seconds_to_decision",
    "p90_seconds_to_decision",
    "grant_uses",
    "graduation_hint",
]
_READING_COLUMNS = [
    "name",
    "decisions",
    "approval_rate",
    "rejection_rate",
    "edit_rate",
    "median_seconds_to_decide",
    "p10_seconds_to_decide",
    "fast_decisions",
    "longest_streak",
    "current_fast_streak",
    "grant_uses",
]


def _stats(args: argparse.Namespace, ops: Operations) -> int:
    """The trust ramp per tool, then how people decide (per tool, per approver) with any warning.
    `--json` stays a list of the trust ramp's tools, each with its `fatigue` figures added."""
    settings = ops.settings
    reading = float(args.reading_time) if args.reading_time else settings.fatigue_reading_seconds
    found = ops.fatigue(reading, args.streak or settings.fatigue_streak)
    approvers = [row.model_dump(mode="json") for row in found.approvers]
    if args.reviewers:
        return _out(args, approvers, [*_READING_COLUMNS, "warning"])
    tools = ops.stats()["tools"]
    reading_of = {row.name: row.model_dump(mode="json") for row in found.tools}
    if args.json:
        return _out(args, [{**tool, "fatigue": reading_of.get(tool["tool"])} for tool in tools])
    _out(args, tools, _TRUST_COLUMNS)
    stopped = [
        {
            "tool": tool["tool"],
            "trigger": kind,
            **counts,
            "rejection_rate": tool.get("trigger_rejection_rates", {}).get(kind),
        }
        for tool in tools
        for kind, counts in sorted((tool.get("triggers") or {}).items())
    ]
    if stopped:
        print("\nCalls stopped by a checkpoint (low confidence, a failed check), and how people decided them:")
        _out(args, stopped, ["tool", "trigger", "gated", "approved", "rejected", "edited", "other", "rejection_rate"])
    print(f"\nHow people decide, per tool (fast: under {reading:g} s from opening the page):")
    _out(args, list(reading_of.values()), _READING_COLUMNS)
    print("\nPer approver:")
    _out(args, approvers, _READING_COLUMNS)
    for warning in found.warnings:
        print(f"\nwarning: {warning}")
    return 0


def _out(args: argparse.Namespace, data: Any, columns: Sequence[str] | None = None) -> int:
    if getattr(args, "json", False) or columns is None:
        print(json.dumps(data, indent=None if getattr(args, "json", False) else 2, default=str))
        return 0
    rows = [[_cell(row.get(c)) for c in columns] for row in data]
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    if not rows:
        print("(none)")
    return 0


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)
