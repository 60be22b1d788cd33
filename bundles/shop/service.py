"""A stand-in for the shop's HTTP API, to try the shop bundle on one machine: `python service.py [PORT]`.

GET /orders/<id> answers an order; POST /refunds refunds once per `Idempotency-Key` (a repeated key gets
the first answer back, which is what a real payment API does) and never more than an order's total: a refund
past what is left is refused with 409 and what is left, so a model that asks five times gets the money back
once.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOTAL = 24.5  # every order is one broken teapot
REFUNDS: dict[str, dict[str, Any]] = {}  # Idempotency-Key -> the refund it made
REFUNDED: dict[str, float] = {}  # order id -> how much of it was refunded


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
        self._send({"order_id": order, "items": ["teapot"], "total": TOTAL, "status": "delivered broken",
                    "refunded": REFUNDED.get(order, 0.0)})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        key = self.headers.get("Idempotency-Key") or ""
        if key in REFUNDS:
            self._send(REFUNDS[key])
            return
        order, amount = str(body.get("order_id")), float(body.get("amount") or 0)
        left = round(TOTAL - REFUNDED.get(order, 0.0), 2)
        if amount > left:
            self._send({"error": f"order {order}: {TOTAL - left:.2f} of {TOTAL:.2f} is refunded already; at "
                                 f"most {left:.2f} more can be"}, 409)
            return
        REFUNDED[order] = REFUNDED.get(order, 0.0) + amount
        REFUNDS[key] = {"refund_id": f"rf-{len(REFUNDS) + 1}", "amount": amount}
        self._send(REFUNDS[key])


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    print(f"shop service on http://127.0.0.1:{port}")
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
