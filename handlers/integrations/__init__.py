"""Adapters that put Countersign's gate under agent frameworks (each behind its own extra)."""
