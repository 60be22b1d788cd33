"""A stand-in for the shop's HTTP API, to try the shop bundle on one machine: `python service.py [PORT]`.

GET /orders/<id> answers an order; POST /refunds refunds once per `Idempotency-Key` (a repeated key gets
the first answer back, which is what a real payment API does).
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REFUNDS: dict[str, dict[str, Any]] = {}


class Handler(BaseHTTPRequestHandler):
    def _send(self, body: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        order = self.path.rsplit("/", 1)[-1]
        self._send({"order_id": order, "items": ["teapot"], "total": 24.5, "status": "delivered broken"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        key = self.headers.get("Idempotency-Key") or ""
        if key not in REFUNDS:
            REFUNDS[key] = {"refund_id": f"rf-{len(REFUNDS) + 1}", "amount": body.get("amount")}
        self._send(REFUNDS[key])


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    print(f"shop service on http://127.0.0.1:{port}")
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
