"""What an operator watches: Prometheus metrics, OpenTelemetry spans and structured logs.

Guarantee: each part costs nothing it was not asked for. Counters are plain in-process increments
(served only when COUNTERSIGN_METRICS_BIND names a listener); spans are made only when the standard
OTEL_EXPORTER_OTLP_* endpoint is set; a log line gains its invocation and approval ids from context
variables Restate already keeps. None of them records an argument value, a fact, a reason or a token.
"""
