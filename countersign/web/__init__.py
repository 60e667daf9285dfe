"""The approver-facing web surface: confirmation pages and (later) provider webhooks."""
