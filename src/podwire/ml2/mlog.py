"""Logging for code that runs inside neutron-server: ``podwire.log.InlineLogger``."""

from __future__ import annotations

from podwire.log import StructuredLogger, get_inline_logger


def get_logger(name: str) -> StructuredLogger:
    return get_inline_logger(name)
