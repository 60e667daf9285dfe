"""A stand-in for Acme's payment provider, for trying the example locally and for its test.

`python -m examples.billing.fake_payments [PORT]` serves on 127.0.0.1 (default 8099):
`GET /invoices/<id>` and `POST /charges`, which honours the `Idempotency-Key` header the way real
payment APIs do: a repeated key returns the first charge and charges nothing.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

INVOICES: dict[str, dict[str, Any]] = {
    "inv_1001": {"invoice_id": "inv_1001", "due_usd": "420.00", "card": "card_visa42", "days_overdue": 12},
    "inv_1002": {"invoice_id": "inv_1002", "due_usd": "80.00", "card": "card_mc7", "days_overdue": 3},
    "inv_1003": {"invoice_id": "inv_1003", "due_usd": "15.00", "card": "card_test1", "days_overdue": 40},
}


class FakePayments(ThreadingHTTPServer):
    """The server and what it was asked: `charges` by idempotency key, `requests` in order."""

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.charges: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakePayments

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path, None))
        invoice = INVOICES.get(self.path.removeprefix("/invoices/"))
        self._answer(200, invoice) if invoice else self._answer(404, {"error": "no such invoice"})

    def do_POST(self) -> None:
        key = self.headers.get("Idempotency-Key")
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
        self.server.requests.append(("POST", self.path, key))
        if self.path != "/charges" or not key:
            self._answer(400, {"error": "POST /charges with an Idempotency-Key"})
            return
        with self.server.lock:
            charge = self.server.charges.setdefault(key, {"id": f"ch_{len(self.server.charges) + 1}", **body})
        self._answer(200, charge)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def main() -> None:
    server = FakePayments(int(sys.argv[1]) if len(sys.argv) > 1 else 8099)
    print(f"fake payments on {server.url}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
