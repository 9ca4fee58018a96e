"""Logging for code that runs inside neutron-server.

Neutron formats records with oslo.log, which ignores podwire's structured ``fields``; the
fields are therefore written into the message itself, so ``ml2.bind.declined host=... reason=...``
reaches neutron.log whole.
"""

from __future__ import annotations

import json
from typing import Any

from podwire.log import StructuredLogger


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


def _line(event: str, fields: dict[str, Any]) -> str:
    return " ".join([event, *(f"{key}={_text(value)}" for key, value in fields.items())])


class InlineLogger(StructuredLogger):
    def exception(self, event: str, **fields: Any) -> None:
        self._logger.error(_line(event, fields), exc_info=True)

    def _log(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, _line(event, fields))


def get_logger(name: str) -> StructuredLogger:
    return InlineLogger(name)
