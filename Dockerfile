# The handlers for HTTP platforms that scale to zero (Cloud Run, Knative, Fly.io): one process serving
# the Restate endpoint under /restate, the approval pages and /healthz, all on the one port these
# platforms route (RESTATE_ENDPOINT_BIND=shared; their front end holds the client connections, so the
# pages keep only their body deadline here). See docs/how-to/deploy/docker.md.
#   docker build -t countersign .        (podman build -t countersign . works the same)

# Stage 1: build the wheel. It carries the package data the app reads at run time: the email
# templates (email_templates/ becomes countersign/mail/email_templates/) and countersign/runtime/hypercorn.toml.
FROM python:3.11-slim AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY countersign ./countersign
COPY email_templates ./email_templates
RUN pip wheel --no-deps -w /dist .

# Stage 2: the wheel installed (not editable) with its dependencies pinned by requirements.lock; no
# source tree in the image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PORT=8080 \
    APPROVALS_OUTBOX_DIR=/tmp/outbox \
    DEMO_DB=/tmp/demo/business.db \
    RESTATE_ENDPOINT_BIND=shared \
    PYTHONPATH=/app

COPY requirements.lock /tmp/requirements.lock
COPY --from=wheel /dist /tmp/dist
RUN pip install -c /tmp/requirements.lock /tmp/dist/*.whl \
    && rm -rf /tmp/dist /tmp/requirements.lock \
    && useradd --system --uid 10001 --no-create-home countersign

# This repository's deployable handlers (the demo's tools and business database, the Lambda function),
# beside the installed library, on PYTHONPATH (as a Lambda function's folder is). No tools are served
# unless named: run the demo with -e COUNTERSIGN_TOOLS=handlers.demo.tools:DEMO_TOOLS, or build your
# own image with your tools where handlers/ is here.
WORKDIR /app
COPY handlers ./handlers
USER countersign
EXPOSE 8080
# The platform sets PORT. exec: python is PID 1 and gets SIGTERM, which `serve` turns into a graceful stop.
CMD ["sh", "-c", "exec countersign serve --bind 0.0.0.0:${PORT}"]
