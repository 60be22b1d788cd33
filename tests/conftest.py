"""Shared test configuration. anyio's own pytest plugin runs async tests (pytest-anyio on PyPI is empty)."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # nats-py uses asyncio primitives directly, so only the asyncio backend is meaningful here.
    return "asyncio"


# Real nats-server fixtures (`nats_server`, `nc`, `js`) for the runtime's integration tests.
pytest_plugins = ["nats_fixtures"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help="also run the large fault-injection soak (tests marked `soak`)")
    parser.addoption("--fault-seed", type=int, default=None,
                     help="seed of the fault-injection schedule (default: random; every run prints its seed)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="a soak: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
