"""AWS Lambda entry point (`countersign.runtime.lambda_handler.handler`): the Restate endpoint behind the SDK's adapter.

Guarantee: the function serves exactly the services of the `/restate` endpoint that `serve` mounts
(same `AgentRun`, same request identity keys), always in request/response mode, and checks the
configuration once per cold start: a bad setting fails the invocation with a one-line reason and
never reaches a handler. The approval pages are not part of it; they run wherever `serve` runs.
"""

from __future__ import annotations

import functools
from typing import Any

from restate.aws_lambda import is_running_on_lambda, wrap_asgi_as_lambda_handler
from restate.server_types import RestateLambdaHandler, RestateLambdaRequest, RestateLambdaResponse

from countersign.runtime import startup
from countersign.runtime.app import restate_endpoint
from countersign.settings import Settings, get_settings


def create_handler(settings: Settings) -> RestateLambdaHandler:
    """A Lambda handler for `settings`: takes API-Gateway-proxy-shaped events as Restate sends them."""
    startup.check(settings)
    endpoint = restate_endpoint(settings)
    # On Lambda (AWS_LAMBDA_FUNCTION_NAME set) `restate.app` already returns the wrapped handler.
    if is_running_on_lambda():
        return endpoint  # type: ignore[no-any-return]
    return wrap_asgi_as_lambda_handler(endpoint)


@functools.cache
def _cold_start() -> RestateLambdaHandler:
    settings = get_settings()
    startup.configure_logging(settings)
    return create_handler(settings)


def handler(event: RestateLambdaRequest, context: Any) -> RestateLambdaResponse:
    """The function's handler; configure it as `countersign.runtime.lambda_handler.handler`."""
    return _cold_start()(event, context)
