"""Examples of Countersign used as a library (run from the repository root; see examples/README.md)."""
