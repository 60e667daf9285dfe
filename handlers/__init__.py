"""This repository's deployable handlers on top of the `countersign` library: the demo agent's tools
and business database (`handlers.demo`), the ASGI app and the AWS Lambda function. Not part of the
library's wheel; they use only its public API, as a team's own deployment would."""
