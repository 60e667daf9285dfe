"""Acme Billing's collections agent on Pydantic AI, gated by Countersign."""
