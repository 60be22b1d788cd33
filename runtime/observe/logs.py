"""Structured logs: `--log-format json` on the long-running commands, one JSON object per line.

    setup_json_logging(logging.INFO)                      # what `sa host --log-format json` does
    with log_context(run_id=run, agent=actor): ...        # every line logged inside carries both

Why a context and not arguments: the lines worth finding by run are logged deep inside the host and the
worker (an append retried, a job given back), by code that should not thread ids through every call.
`log_context` sets them once per run (the host, around driving it) and once per job (the worker), in a
context variable that each asyncio task inherits; a filter copies them onto every record, where the JSON
formatter (python-json-logger) writes them as fields: `run_id`, `agent`, `seq`, `call_id` where known
(`extra={"seq": ...}` on a call adds one for that line). Text logs ignore them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("sa_log_fields", default=None)
FIELDS = ("run_id", "agent", "seq", "call_id")


class LogFormat(StrEnum):
    """What `--log-format` accepts."""

    text = "text"
    json = "json"


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


def json_handler(stream: TextIO | None = None) -> logging.Handler:
    """A handler writing one JSON object per record: time, level, logger, message, then the context
    fields and any `extra=`; an exception comes as `exc_info` text."""
    handler = logging.StreamHandler(stream or sys.stderr)
    renamed = {"asctime": "time", "levelname": "level", "name": "logger"}
    fmt = "{asctime}{levelname}{name}{message}"
    handler.setFormatter(JsonFormatter(fmt, style="{", rename_fields=renamed))
    handler.addFilter(ContextFilter())
    return handler


def setup_json_logging(level: int, stream: TextIO | None = None) -> None:
    """Route every log record of the process through one JSON handler at `level` (replacing any)."""
    logging.basicConfig(level=level, handlers=[json_handler(stream)], force=True)


__all__ = ["FIELDS", "ContextFilter", "LogFormat", "json_handler", "log_context", "setup_json_logging"]
