"""Shared test configuration. anyio's own pytest plugin runs async tests (pytest-anyio on PyPI is empty)."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # nats-py uses asyncio primitives directly, so only the asyncio backend is meaningful here.
    return "asyncio"


# Real nats-server fixtures (`nats_server`, `nc`, `js`) for the runtime's integration tests.
pytest_plugins = ["nats_fixtures"]
