"""The gate, callable from any Restate handler: freeze, ask, wait (votes, rounds, reminders,
escalation, deadline), decide, act."""
