"""Structured logs: `--log-format json` on the long-running commands, one JSON object per line.

    setup_json_logging(logging.INFO)                      # what `sa host --log-format json` does

The host and the worker set a run's or a job's fields with `runtime.logfields.log_context`; the handler
here copies them onto every record (`ContextFilter`) and the JSON formatter (python-json-logger) writes them
as fields: `run_id`, `agent`, `seq`, `call_id` where known (`extra={"seq": ...}` on a call adds one for that
line). Text logs ignore them.
"""

from __future__ import annotations

import logging
import sys
from enum import StrEnum
from typing import TextIO

from pythonjsonlogger.json import JsonFormatter

from runtime.logfields import ContextFilter


class LogFormat(StrEnum):
    """What `--log-format` accepts."""

    text = "text"
    json = "json"


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


__all__ = ["LogFormat", "json_handler", "setup_json_logging"]
