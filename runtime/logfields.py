"""The fields a process's log lines carry: run id, agent, seq, call id, set once per run or job.

    with log_context(run_id=run, agent=actor): ...        # every line logged inside carries both

Why a context and not arguments: the lines worth finding by run are logged deep inside the host and the
worker (an append retried, a job given back), by code that should not thread ids through every call.
`log_context` sets them once per run (the host, around driving it) and once per job (the worker), in a
context variable that each asyncio task inherits; `ContextFilter` copies them onto every record, where a
structured handler writes them as fields (`--log-format json`, `runtime.observe.logs`). Text logs ignore
them.

Why a module of its own, low in the house: the host and the worker set the fields on every run and job,
while writing them out is a face's concern (the JSON formatter, chosen on the command line). Setting them
needs nothing but the standard library, so a host or worker imports this and never a face.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("sa_log_fields", default=None)
FIELDS = ("run_id", "agent", "seq", "call_id")


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Within the block (and the tasks it starts), log records carry `fields` (None values are left out)."""
    token = _FIELDS.set({**(_FIELDS.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _FIELDS.reset(token)


class ContextFilter(logging.Filter):
    """Copies the current `log_context` fields onto each record (a field the call set itself wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_FIELDS.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


__all__ = ["FIELDS", "ContextFilter", "log_context"]
