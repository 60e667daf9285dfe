"""Adapters that put Countersign's gate under agent frameworks (each one behind its own extra).

Importing this package imports no framework: each adapter module imports its framework itself and,
when the extra is not installed, fails with an ImportError that names the extra to install.
"""
