"""Metrics, traces and logs, seen from outside as an operator's tools see them.

`/metrics` is scraped over HTTP from the listener of its own and parsed with prometheus-client's
parser; spans are received by an OTLP/HTTP endpoint in this test process that decodes them with
opentelemetry-proto, from both the handlers and restate-server (RESTATE_TRACING_ENDPOINT); log lines
are read from the handlers' own output. The counting tests run with a crash (kill -9 while an
approval waits) and under replay torture (inactivity timeout 0 s: every await suspends and every
resume replays the journal), and count each event exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes import otlp_receiver
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from support.approver import approval_emails, form_csrf, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import REPO, IsolatedStack, StackFactory, free_port, parked, wait_until

from countersign.exceptions import SettingsError
from countersign.runtime.server import listeners
from countersign.settings import Settings

REASON = "reason-zq81x"
"""An argument value that must appear in no span, metric or label."""
AMOUNT = "812.34"
FORCED_REPLAY = {"RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT": "0s"}


def refund(order: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": AMOUNT, "reason": REASON}}],
    }


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> tuple[Samples, str]:
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, reply.text


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; 0 when absent (a counter not yet incremented in this process)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def metrics_stack(isolated_stack: StackFactory, **restate_env: str) -> tuple[IsolatedStack, int]:
    port = free_port()
    env = {
        "COUNTERSIGN_METRICS_BIND": f"127.0.0.1:{port}",
        "COUNTERSIGN_METRICS_CACHE_SECONDS": "0",
        "COUNTERSIGN_LOG_FORMAT": "json",
    }
    return isolated_stack(app_env=env, restate_env=restate_env or None), port


def statuses(stack: IsolatedStack, run_id: str) -> set[str]:
    return {
        row["status"] for row in stack.restate.invocation_statuses(key=run_id) if row["target_handler_name"] == "run"
    }


REFUND = {"tool": "issue_refund", "tenant": "default"}


def waiting_once(port: int) -> Samples | None:
    samples, _ = scrape(port)
    return samples if value(samples, "countersign_approvals_waiting", **REFUND) == 1 else None


def test_a_bad_metrics_bind_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError, match="countersign_metrics_bind"):
        Settings(countersign_metrics_bind="nonsense")
    settings = Settings(countersign_metrics_bind="127.0.0.1:9080")
    with pytest.raises(SettingsError) as refused:
        listeners(settings, "127.0.0.1:9080")
    assert refused.value.setting == "COUNTERSIGN_METRICS_BIND"
    assert "\n" not in str(refused.value)


def test_serve_stops_at_start_with_one_line_naming_a_bad_setting(tmp_path: Path) -> None:
    import subprocess
    import sys

    for variable, bad in (("COUNTERSIGN_METRICS_BIND", "no-port"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")):
        env = {"PATH": "/usr/bin:/bin", variable: bad}
        done = subprocess.run(
            [sys.executable, "-m", "countersign", "serve", "--bind", f"127.0.0.1:{free_port()}"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
        )
        assert done.returncode != 0
        [line] = done.stderr.strip().splitlines()
        assert variable in line, line


@pytest.mark.slow
def test_counts_survive_a_kill9_while_waiting_once_each(isolated_stack: StackFactory) -> None:
    """The request is counted by the process that sent it; after kill -9 and a restart the replay
    counts nothing again, the waiting figure comes from Restate's state, and the decision and the
    effect are counted once by the new process. Summed over both processes: one of each."""
    stack, port = metrics_stack(isolated_stack)
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run("obs-kill", refund(order))
    [mail] = wait_for_email(stack.outbox_dir, "obs-kill")
    csrf = form_csrf(mail.link)
    before = wait_until(lambda: waiting_once(port), 30, "the approval to show as waiting")
    assert value(before, "countersign_approvals_requested_total", channel="email", **REFUND) == 1
    assert value(before, "countersign_durable_state_up") == 1

    stack.app.kill9()
    wait_until(lambda: parked(statuses(stack, "obs-kill")), 30, "the run to park")
    stack.app.restart()
    restarted, _ = scrape(port)
    assert value(restarted, "countersign_approvals_waiting", **REFUND) == 1, "durable, not in-process"
    assert total(restarted, "countersign_approvals_requested_total") == 0

    assert submit(mail.link, "approve", csrf=csrf).status_code == 200
    assert stack.ingress.wait_output("obs-kill", timeout=60).json()["status"] == "completed"
    assert refunds_for(stack.db_path, "obs-kill") == [("obs-kill/0", order, 81234)]
    after, text = scrape(port)
    assert total(after, "countersign_approvals_requested_total") == 0, "the replay re-counted the request"
    assert (
        value(after, "countersign_approvals_decided_total", tool="issue_refund", verdict="approved", source="human")
        == 1
    )
    assert total(after, "countersign_approvals_decided_total") == 1
    assert value(after, "countersign_decision_seconds_count", tool="issue_refund", source="human") == 1
    assert value(after, "countersign_effects_total", tool="issue_refund", outcome="succeeded") == 1
    assert total(after, "countersign_effects_total") == 1
    assert value(after, "countersign_runs_finished_total", status="completed") == 1
    assert value(after, "countersign_approvals_waiting", **REFUND) == 0
    assert REASON not in text and AMOUNT not in text

    lines = [json.loads(line) for line in stack.app.log_path.read_text().splitlines() if line.startswith("{")]
    mail_lines = [line for line in lines if line["logger"] == "countersign.mail"]
    assert any("outcome email" in line["message"] for line in mail_lines), "the outcome email's log line"
    assert all(line["invocation_id"].startswith("inv_") for line in mail_lines)
    assert all(line["approval_id"] == "obs-kill-a0" for line in mail_lines)


@pytest.mark.slow
def test_replay_torture_counts_each_event_once(isolated_stack: StackFactory) -> None:
    """Every await suspends and every resume replays the journal from the start, in one process
    whose counters see every replay: still one request, one decision, one effect, one run."""
    stack, port = metrics_stack(isolated_stack, **FORCED_REPLAY)
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run("obs-replay", refund(order))
    [mail] = wait_for_email(stack.outbox_dir, "obs-replay")
    assert submit(mail.link, "approve").status_code == 200
    assert stack.ingress.wait_output("obs-replay", timeout=60).json()["status"] == "completed"
    samples, _ = scrape(port)
    assert value(samples, "countersign_approvals_requested_total", channel="email", **REFUND) == 1
    assert total(samples, "countersign_approvals_requested_total") == 1
    assert (
        value(samples, "countersign_approvals_decided_total", tool="issue_refund", verdict="approved", source="human")
        == 1
    )
    assert total(samples, "countersign_approvals_decided_total") == 1
    assert total(samples, "countersign_effects_total") == 1
    assert total(samples, "countersign_runs_finished_total") == 1


@pytest.mark.slow
def test_reminders_escalation_and_deadline_are_counted_as_their_emails(
    isolated_stack: StackFactory, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        "[tools.issue_refund]\ndeadline_seconds = 4\nreminders_seconds = [1]\n"
        'escalate_after_seconds = 2\nescalate_to = ["boss@example.com"]\n'
    )
    port = free_port()
    env = {"COUNTERSIGN_METRICS_BIND": f"127.0.0.1:{port}", "APPROVALS_POLICY_FILE": str(policy)}
    stack = isolated_stack(app_env=env)
    stack.ingress.start_run("obs-late", refund(new_order(stack.db_path, 100000)))
    result = stack.ingress.wait_output("obs-late", timeout=60).json()
    assert result["actions"][0]["outcome"] == "expired"
    samples, _ = scrape(port)
    emails = {kind: len(approval_emails(stack.outbox_dir, "obs-late", kind)) for kind in ("reminder", "escalation")}
    assert emails["reminder"] >= 1 and emails["escalation"] == 1, emails
    assert value(samples, "countersign_reminders_sent_total", tool="issue_refund") == emails["reminder"]
    assert value(samples, "countersign_escalations_total", tool="issue_refund") == 1
    assert (
        value(
            samples,
            "countersign_approvals_decided_total",
            tool="issue_refund",
            verdict="expired",
            source="deadline_default",
        )
        == 1
    )
    assert total(samples, "countersign_approvals_decided_total") == 1
    assert total(samples, "countersign_approvals_requested_total") == 1
    assert total(samples, "countersign_effects_total") == 0


def test_the_metrics_listener_serves_metrics_only(isolated_stack: StackFactory) -> None:
    stack, port = metrics_stack(isolated_stack)
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 404
    assert httpx.get(f"http://127.0.0.1:{port}/metrics/", timeout=10).status_code == 404
    assert httpx.get(f"{stack.app.url}/metrics", timeout=10).status_code == 404, "never on the pages' listener"


@pytest.mark.slow
def test_spans_sit_in_restates_traces_once_each_and_carry_no_values(isolated_stack: StackFactory) -> None:
    with otlp_receiver.running() as receiver:
        restate_env = {**FORCED_REPLAY, "RESTATE_TRACING_ENDPOINT": f"otlp+http://127.0.0.1:{receiver.port}/v1/traces"}
        app_env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url,
            "OTEL_SERVICE_NAME": "countersign-test",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        stack = isolated_stack(app_env=app_env, restate_env=restate_env)
        order = new_order(stack.db_path, 100000)
        stack.ingress.start_run("obs-trace", refund(order))
        [mail] = wait_for_email(stack.outbox_dir, "obs-trace")
        token = mail.link.rsplit("/", 1)[1]
        assert submit(mail.link, "approve").status_code == 200
        assert stack.ingress.wait_output("obs-trace", timeout=60).json()["status"] == "completed"

        wanted = {"model turn", "email request", "decision", "recheck", "effect"}

        def ours_and_parents() -> list[otlp_receiver.ReceivedSpan] | None:
            spans = receiver.snapshot()
            ours = [s for s in spans if s.service == "countersign-test" and s.attributes.get("countersign.run_id")]
            restate_ids = {s.span_id for s in spans if s.service != "countersign-test"}
            if not wanted <= {s.name for s in ours} or not all(s.parent_id in restate_ids for s in ours):
                return None
            return spans

        try:
            spans = wait_until(ours_and_parents, 90, "our spans and restate-server's spans that parent them")
        except TimeoutError:
            seen = sorted({(s.service, s.name, bool(s.parent_id)) for s in receiver.snapshot()})
            raise AssertionError(f"spans received: {seen}") from None
        ours = [s for s in spans if s.service == "countersign-test" and s.attributes.get("countersign.run_id")]
        by_id = {s.span_id: s for s in spans}
        for span in ours:
            parent = by_id[span.parent_id]
            assert parent.trace_id == span.trace_id
            assert parent.name.startswith("invocation-attempt") or "attempt" in parent.name, parent.name
        # Replayed at every await, and still one span per step (two model turns: the call, then the answer).
        names = sorted(s.name for s in ours)
        assert names == ["decision", "effect", "email request", "model turn", "model turn", "recheck"], names
        decision = next(s for s in ours if s.name == "decision")
        assert decision.attributes["countersign.verdict"] == "approved"
        assert decision.attributes["countersign.decision_source"] == "human"
        assert decision.attributes["countersign.approval_id"] == "obs-trace-a0"
        assert decision.attributes["countersign.tool"] == "issue_refund"
        email = next(s for s in ours if s.name == "email request")
        assert email.attributes["countersign.channel"] == "email"
        assert len({s.trace_id for s in ours}) == 1, "one trace from the run's start to the effect"
        body = b"".join(receiver.raw)
        for secret in (REASON, AMOUNT, token, "alice@example.com"):
            assert secret.encode() not in body, f"{secret!r} left the process in a span"


def test_tracing_off_makes_no_spans_and_imports_no_sdk(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from countersign.observability import tracing; from countersign.settings import Settings;"
        "assert not tracing.configure(Settings());"
        "assert 'opentelemetry.sdk.trace' not in sys.modules, 'the SDK was imported with tracing off'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    """Every countersign_* series the Grafana dashboard queries is one the handlers expose."""
    import re

    from prometheus_client import generate_latest

    from countersign.observability.metrics import REGISTRY
    from countersign.runtime.metrics import WaitingApprovals

    exposed = generate_latest(REGISTRY).decode() + "".join(
        f"# TYPE {family.name} gauge\n" for family in WaitingApprovals(Settings()).collect()
    )
    families = set(re.findall(r"^# TYPE (countersign_\w+) (\w+)", exposed, re.M))
    names = {name for name, _ in families}
    series = names | {f"{n}_total" for n, kind in families if kind == "counter"}
    series |= {f"{n}_{part}" for n, kind in families if kind == "histogram" for part in ("bucket", "sum", "count")}
    dashboard = (REPO / "deploy" / "grafana" / "countersign.json").read_text()
    queried = set(re.findall(r"countersign_[a-z_]+", dashboard))
    assert queried - series == set()
    assert {"countersign_approvals_waiting", "countersign_decision_seconds_bucket"} <= queried
