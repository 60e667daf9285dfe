"""This repository's AWS Lambda function: configure the function's handler as
`handlers.lambda_function.handler`, with this folder's parent (the deployment package's root) as the
function's code, so that `handlers.demo.tools` (or your own tools) import as COUNTERSIGN_TOOLS names
them. It serves the Restate endpoint only, in request/response mode; see docs/how-to/deploy/lambda.md."""

from countersign import lambda_handler as handler

__all__ = ["handler"]
