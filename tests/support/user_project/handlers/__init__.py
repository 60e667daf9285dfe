"""A user's own serverless project, as AWS Lambda lays one out: its code in a `handlers/` package that
the platform puts first on `sys.path`. The wheel test installs Countersign beside it and serves these
tools with the `countersign` console script, so the two names can never shadow each other."""
