"""Countersign: durable, emailed human approval for AI agent actions, on Restate."""
