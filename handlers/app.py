"""This repository's ASGI app, for an ASGI server of your choice (`hypercorn handlers.app:app`): the
Restate endpoint under `/restate`, the approval pages, the webhooks and `/healthz` on one port, with
the tools and services the settings name. `countersign serve` serves the same app with the limits the
Restate endpoint needs (see docs/how-to/deploy/docker.md); prefer it where you can run a command."""

from countersign import create_app

app = create_app()
