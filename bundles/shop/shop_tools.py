"""The shop bundle's Python side: a Python tool and the externals factory of its `.pym` tools.

Both talk to the shop's HTTP service at `SHOP_URL` (default http://127.0.0.1:8765; `python
bundles/shop/service.py` runs a stand-in). Workers import this module from beside the bundle file.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from runtime.externals import ExecutionContext


def _url(path: str) -> str:
    return os.environ.get("SHOP_URL", "http://127.0.0.1:8765").rstrip("/") + path


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up in the shop: its items, total and status.

    Args:
        order_id: the order's id, e.g. A17
    """
    with urllib.request.urlopen(_url(f"/orders/{order_id}"), timeout=10) as r:
        result: dict[str, Any] = json.loads(r.read())
        return result


class Externals:
    """The host functions of the shop's scripts, built per tool call."""

    def build(self, tool_name: str, context: ExecutionContext) -> dict[str, Callable[..., Any]]:
        def refund(order_id: str, amount: float, *, idempotency_key: str) -> dict[str, Any]:
            # the key is the same on every delivery of this job: the shop refunds once however often
            # a crashed worker's job runs again
            body = json.dumps({"order_id": order_id, "amount": amount, "run": context.run_id}).encode()
            req = urllib.request.Request(_url("/refunds"), data=body, method="POST",
                                         headers={"Idempotency-Key": idempotency_key,
                                                  "content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    result: dict[str, Any] = json.loads(r.read())
                    return result
            except urllib.error.HTTPError as e:  # the shop said no: its reason is what the model reads
                said = json.loads(e.read() or b"{}").get("error")
                raise ValueError(said or f"the shop refused: {e}") from None

        return {"refund": refund}
