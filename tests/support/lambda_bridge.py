"""Stand-in for AWS Lambda's Invoke API: turns Restate's HTTP/1.1 requests into Lambda events.

Run as `python tests/support/lambda_bridge.py --bind 127.0.0.1:PORT`. Each request becomes the event
restate-server sends to a Lambda function (`path`, `httpMethod`, `headers`, base64 `body`,
`isBase64Encoded: true`; see restate's service-client `ApiGatewayProxyRequest`) and is passed to
`handlers.lambda_function.handler` (this repository's function) in this process, one at a time on
one thread, as one Lambda instance would. The handler's response dict is written back as the HTTP
response. `GET /healthz` is answered by the bridge itself. Each event is logged as
`lambda event: METHOD PATH -> STATUS`.

Guarantee: the handler sees nothing but the event and returns nothing but its response dict; the
bridge adds no behaviour of its own (no retries, no caching).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import http.server
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from restate.server_types import RestateLambdaRequest, RestateLambdaResponse

# Lambda puts the function's code folder first on sys.path: here, the repository's root (handlers/).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from handlers.lambda_function import handler

# Lambda runs one event at a time per instance; the SDK adapter also keeps its event loop per thread.
_instance = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lambda")


def invoke(event: RestateLambdaRequest) -> RestateLambdaResponse:
    return _instance.submit(handler, event, None).result()


class Bridge(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._reply(200, {"content-type": "text/plain"}, b"ok")
        else:
            self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _forward(self) -> None:
        event: RestateLambdaRequest = {
            "path": urlsplit(self.path).path,
            "httpMethod": self.command,
            "headers": {key.lower(): value for key, value in self.headers.items()},
            "body": base64.b64encode(self._body()).decode(),
            "isBase64Encoded": True,
        }
        response = invoke(event)
        body = response.get("body") or ""
        raw = base64.b64decode(body) if response.get("isBase64Encoded") else body.encode()
        status = int(response["statusCode"])
        print(f"lambda event: {self.command} {event['path']} -> {status}", flush=True)
        self._reply(status, dict(response.get("headers") or {}), raw)

    def _reply(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers.items():
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(key, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request access log (the event line above says what matters)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", required=True, help="HOST:PORT")
    host, port = parser.parse_args().bind.rsplit(":", 1)
    server = http.server.ThreadingHTTPServer((host, int(port)), Bridge)
    print(f"lambda bridge on {host}:{port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
