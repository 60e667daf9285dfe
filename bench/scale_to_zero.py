"""What a paused run costs the handler: its RSS before and after pausing 1,000 runs, then with no handler.

`python -m bench.scale_to_zero [--runs 1000] [--protocol http1.1|http2]` starts its own restate-server
and handlers (the test suite's helpers: loopback, free ports) and runs two phases of the same runs,
each a gated $600 refund started by a closed loop of `--concurrency` workers:

* paused: every run waits for its approval. After a warm-up batch (the allocator's working set for
  that concurrency), the handler's VmRSS is read whenever a batch is all `suspended` in Restate. At
  the end the handler is stopped and Restate must still hold every run suspended.
* control: the policy gives each run a 1-second deadline, so it goes through the same path (model
  turns, policy, email, the approval round) and then completes as expired: nothing stays paused.

Handler memory held per paused run = the paused phase's RSS growth per run minus the control's. The
control is needed: the work of asking moves RSS by itself (allocator fragmentation, buffers of the
connections Restate keeps open). Exit 1 if the difference exceeds `--max-bytes-per-run` or a run was
lost.

Guarantee: every process it starts is stopped by PID before it exits, whatever happens; every wait is
bounded; RSS is read only when every run of the batch has reached its wait or its end.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from support.business import new_order
from support.processes import (
    DEPLOYMENT_PROTOCOLS,
    Ingress,
    RestateServer,
    make_app_env,
    start_registered_app,
    wait_until,
)

MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def task(order: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "600.00", "reason": "bench"}}],
    }


def start_runs(
    ingress: Callable[[], Ingress], outbox: Path, run_ids: list[str], orders: dict[str, int], n: int
) -> None:
    """A closed loop: each of `n` workers starts a run and waits for its approval email (the run has
    reached its wait) before starting the next, so at most `n` runs are in flight."""
    local = threading.local()
    clients: list[Ingress] = []

    def init() -> None:
        local.client = ingress()
        clients.append(local.client)

    def emailed(run_id: str) -> bool:
        return any(outbox.glob(f"approval-request_{run_id}-a*.eml"))

    def start(run_id: str) -> None:
        reply = local.client.start_run(run_id, task(orders[run_id]))
        if reply.status_code != 202:
            raise RuntimeError(f"starting {run_id}: HTTP {reply.status_code} {reply.text}")
        wait_until(functools.partial(emailed, run_id), 120, f"{run_id} to ask for approval", interval=0.05)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=n, initializer=init) as pool:
            for future in [pool.submit(start, run_id) for run_id in run_ids]:
                future.result(timeout=600)
    finally:
        for client in clients:
            client.close()


def connections(port: int) -> int:
    """TCP connections the handler holds on its port (any state but LISTEN), from /proc/net/tcp."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if int(local.rsplit(":", 1)[1], 16) == port and state != "0A":
            count += 1
    return count


def run_states(restate: RestateServer) -> dict[str, int]:
    rows = restate.sql(
        "select status, count(*) as n from sys_invocation"
        " where target_service_name = 'AgentRun' and target_handler_name = 'run' group by status"
    )
    return {row["status"]: int(row["n"]) for row in rows}


def all_in(restate: RestateServer, status: str, count: int) -> bool:
    return run_states(restate) == {status: count}


def batches(run_ids: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(run_ids), size):
        yield run_ids[i : i + size]


def phase(args: argparse.Namespace, root: Path, *, control: bool) -> dict[str, Any]:
    """Pause the runs (or, as the control, let each expire one second after it asks) and read RSS."""
    with ExitStack() as stack:
        restate = RestateServer.start(root / "restate")
        stack.callback(restate.stop)
        env = make_app_env(ingress_url=restate.ingress_url, outbox_dir=root / "outbox", db_path=root / "business.db")
        if control:
            policy = root / "expire-at-once.toml"
            policy.write_text("[tools.issue_refund]\ndeadline_seconds = 1\nreminders_seconds = []\n")
            env["APPROVALS_POLICY_FILE"] = str(policy)
        app = start_registered_app(
            restate, env=env, log_path=root / "app.log", http1=DEPLOYMENT_PROTOCOLS[args.protocol]
        )
        stack.callback(app.stop)
        ingress = functools.partial(Ingress, restate.ingress_url, env["COUNTERSIGN_JOURNAL_KEYS"])
        batch = max(1, args.runs // args.batches)
        warmup = batch if args.warmup is None else args.warmup
        names = [f"warm-{i:04d}" for i in range(warmup)] + [f"run-{i:05d}" for i in range(args.runs)]
        orders = {run_id: new_order(Path(env["DEMO_DB"]), 100000) for run_id in names}
        status = "completed" if control else "suspended"

        def reading(runs: int) -> dict[str, Any]:
            return {
                "runs": runs,
                "handler_rss": rss_bytes(app.pid),
                "restate_rss": rss_bytes(restate.pid),
                "handler_connections": connections(app.restate_port),
            }

        rows = [reading(0)]
        t0 = time.monotonic()
        for group in [names[:warmup], *batches(names[warmup:], batch)]:
            start_runs(ingress, root / "outbox", group, orders, args.concurrency)
            runs: int = rows[-1]["runs"] + len(group)
            done = functools.partial(all_in, restate, status, runs)
            wait_until(done, args.timeout, f"{runs} runs to be {status}", interval=0.5)
            rows.append(reading(runs))
            row = rows[-1]
            print(
                f"  {runs:5d} {status:9s}  handler {row['handler_rss'] / MIB:6.1f} MiB,"
                f" {row['handler_connections']:3d} connections  restate-server {row['restate_rss'] / MIB:6.1f} MiB"
                f"  ({time.monotonic() - t0:5.1f} s)",
                flush=True,
            )
        app.stop()
        warm, last = rows[1], rows[-1]
        return {
            "status": status,
            "rows": rows,
            "handler_bytes_per_run": (last["handler_rss"] - warm["handler_rss"]) / args.runs,
            "restate_bytes_per_run": (last["restate_rss"] - warm["restate_rss"]) / args.runs,
            "after_handler_stopped": run_states(restate),
            "seconds": time.monotonic() - t0,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_to_zero", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs measured after the warm-up (default 1000)")
    parser.add_argument("--batches", type=int, default=4, help="RSS readings across the runs (default 4)")
    parser.add_argument("--warmup", type=int, help="runs before the baseline reading (default: one batch)")
    parser.add_argument("--protocol", choices=list(DEPLOYMENT_PROTOCOLS), default="http1.1")
    parser.add_argument("--concurrency", type=int, default=16, help="runs in flight at once (default 16)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a batch may take")
    parser.add_argument("--max-bytes-per-run", type=float, default=1024, help="allowed RSS held per paused run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    results = {}
    for name, control in (("paused", False), ("control", True)):
        what = "each expires 1 s after it asks (control)" if control else "each pauses on its approval"
        print(
            f"{args.protocol} deployment, {args.concurrency} in flight: a warm-up batch, then {args.runs} runs; {what}",
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="scale-to-zero-") as tmp:
            results[name] = phase(args, Path(tmp), control=control)
    paused, control_run = results["paused"], results["control"]
    held = paused["handler_bytes_per_run"] - control_run["handler_bytes_per_run"]
    warm, last = paused["rows"][1], paused["rows"][-1]
    print(
        f"handler RSS with runs paused: {warm['handler_rss'] / MIB:.1f} MiB after the warm-up,"
        f" {last['handler_rss'] / MIB:.1f} MiB with {last['runs']} paused:"
        f" {paused['handler_bytes_per_run']:.0f} bytes per run;"
        f" the control (same path, nothing left paused): {control_run['handler_bytes_per_run']:.0f} bytes per run"
    )
    print(
        f"held per paused run: {held:.0f} bytes in the handler,"
        f" {paused['restate_bytes_per_run'] - control_run['restate_bytes_per_run']:.0f} in restate-server"
    )
    print(f"handler stopped: Restate holds {paused['after_handler_stopped']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        summary = {"protocol": args.protocol, "runs": args.runs, "concurrency": args.concurrency, "held": held}
        args.json.write_text(json.dumps({**summary, **results}, indent=2) + "\n", encoding="utf-8")
    ok = held <= args.max_bytes_per_run and paused["after_handler_stopped"] == {"suspended": last["runs"]}
    print("PASS" if ok else "FAIL: the handler holds memory per paused run, or runs were lost")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
