"""Shared test configuration. anyio's own pytest plugin runs async tests (pytest-anyio on PyPI is empty)."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # nats-py uses asyncio primitives directly, so only the asyncio backend is meaningful here.
    return "asyncio"
