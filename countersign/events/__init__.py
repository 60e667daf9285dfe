"""Signed outbound webhooks: what happened to approvals and runs, told to the systems that subscribe.

Guarantee: `approval.requested`, `approval.decided`, `action.executed` and `run.finished` are each
one journaled one-way send from the run that saw them happen (`countersign.events.emit`), so the run
never waits for a receiver; each event has one `webhook-id`, the same across retries, replays and a
re-sent event, and is delivered (Standard Webhooks signature) to every endpoint COUNTERSIGN_WEBHOOKS
names for its tenant by `countersign.events.delivery`, in order per approval and endpoint, with bounded
retries on durable timers, the outcome recorded where `python -m countersign show` finds it.
"""
