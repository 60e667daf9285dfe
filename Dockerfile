# The handlers for HTTP platforms that scale to zero (Cloud Run, Knative, Fly.io): one process serving
# the Restate endpoint under /restate, the approval pages and /healthz, all on the one port these
# platforms route (RESTATE_ENDPOINT_BIND=shared; their front end holds the client connections, so the
# pages keep only their body deadline here). See docs/deployment.md.
#   docker build -t countersign .        (podman build -t countersign . works the same)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PORT=8080 \
    APPROVALS_OUTBOX_DIR=/tmp/outbox \
    DEMO_DB=/tmp/demo/business.db \
    RESTATE_ENDPOINT_BIND=shared

WORKDIR /app
COPY pyproject.toml requirements.lock README.md ./
COPY handlers ./handlers
COPY email_templates ./email_templates
# Editable: the app reads email_templates/ from beside the package, as in the repo.
RUN pip install -c requirements.lock -e . \
    && useradd --system --uid 10001 --no-create-home countersign

USER countersign
EXPOSE 8080
# The platform sets PORT. exec: python is PID 1 and gets SIGTERM, which `serve` turns into a graceful stop.
CMD ["sh", "-c", "exec python -m handlers serve --bind 0.0.0.0:${PORT}"]
