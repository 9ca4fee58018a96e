"""Structured logging: ``event key=value ...`` lines (or JSON) that an operator can grep.

Callers log an event name plus fields: ``log.info("port.wired", port=pid, host=host)``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from podwire.config import LogSettings


class StructuredLogger:
    """A thin wrapper so every call site passes fields, never pre-formatted strings."""

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._logger.error(event, exc_info=True, extra={"fields": fields})

    def _log(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": fields})


def get_logger(name: str) -> StructuredLogger:
    return StructuredLogger(name)


def _inline_text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


def _inline_line(event: str, fields: dict[str, Any]) -> str:
    return " ".join([event, *(f"{key}={_inline_text(value)}" for key, value in fields.items())])


class InlineLogger(StructuredLogger):
    """For code that runs inside Neutron's processes (the ml2 driver, the interface driver).

    Neutron formats records with oslo.log, which ignores podwire's structured ``fields``; the
    fields are therefore written into the message itself, so ``ml2.bind.declined host=...
    reason=...`` reaches Neutron's log whole.
    """

    def exception(self, event: str, **fields: Any) -> None:
        self._logger.error(_inline_line(event, fields), exc_info=True)

    def _log(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, _inline_line(event, fields))


def get_inline_logger(name: str) -> StructuredLogger:
    return InlineLogger(name)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger event key=value ...``: also how the tests show captured records."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"{stamp}.{int(record.msecs):03d}Z", record.levelname, record.name]
        parts.append(record.getMessage())
        parts.extend(f"{key}={_inline_text(value)}" for key, value in fields.items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def setup_logging(settings: LogSettings, stream: Any = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_JsonFormatter() if settings.format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level.upper())
