"""The shipped `bundles/shop` example does what its comments say, in process, against its own stand-in
service: a refund before the order was looked up is refused by the bundle's policy, the shop never refunds
more than the order's total however often the model asks, and a big refund waits for a person."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from host_helpers import hermes_call

from runtime import Agent
from runtime import events as ev
from runtime.model import ModelClient
from runtime.testing import ScriptedModelServer

pytestmark = pytest.mark.anyio
SHOP = Path(__file__).parents[2] / "bundles" / "shop"


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The bundle's own stand-in shop service (`bundles/shop/service.py`), on a free port."""
    spec = importlib.util.spec_from_file_location("shop_service", SHOP / "service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = ThreadingHTTPServer(("127.0.0.1", 0), module.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SHOP_URL", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield module
    finally:
        server.shutdown()


def scripted(*calls: tuple[str, dict[str, Any]]) -> Any:
    """A model that makes `calls` in order, one per turn, whatever the tools answered."""
    def model(body: dict[str, Any]) -> str:
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        name, arguments = calls[min(turn, len(calls) - 1)]
        return hermes_call(name, arguments)
    return model


async def test_a_model_that_refunds_blindly_and_often_gets_the_money_back_once(service: Any) -> None:
    refund = ("refund", {"order_id": "A17", "amount": 10})
    model = scripted(refund, ("lookup_order", {"order_id": "A17"}), refund, refund, refund,
                     ("final_answer", {"answer": "refunded"}))
    with ScriptedModelServer(responder=model) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            agent = Agent.from_bundle(SHOP, client=client)
            result = await agent.run("Order A17 arrived broken: refund it.")
    outcomes = [e for e in result.events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)]
    assert [(e.tool, isinstance(e, ev.ToolCompleted)) for e in outcomes] == [
        ("refund", False), ("lookup_order", True), ("refund", True), ("refund", True), ("refund", False),
        ("final_answer", True)]
    before_lookup, over_total = outcomes[0], outcomes[4]
    assert isinstance(before_lookup, ev.ToolFailed) and before_lookup.error.kind == "policy"
    assert "refund requires lookup_order to succeed first" in before_lookup.error.message
    assert isinstance(over_total, ev.ToolFailed)
    assert "20.00 of 24.50 is refunded already; at most 4.50 more" in over_total.error.message
    assert service.REFUNDED == {"A17": 20.0}  # two refunds of 10 reached the shop, not four
    assert result.ok


async def test_a_refund_over_20_waits_for_the_support_role(service: Any) -> None:
    model = scripted(("lookup_order", {"order_id": "A17"}), ("refund", {"order_id": "A17", "amount": 24.5}),
                     ("final_answer", {"answer": "done"}))
    asked: list[str] = []

    async def approver(call: Any) -> str | None:
        asked.append(call.name)
        return "a person looks at refunds over 20 first"

    with ScriptedModelServer(responder=model) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            agent = Agent.from_bundle(SHOP, client=client)
            result = await agent.run("Refund A17 in full.", approver=approver)
    requested = next(e for e in result.events if isinstance(e, ev.ApprovalRequested))
    assert requested.call.name == "refund" and requested.role == "support" and asked == ["refund"]
    assert any(isinstance(e, ev.ApprovalDenied) for e in result.events)
    assert service.REFUNDED == {}  # denied: nothing reached the shop
