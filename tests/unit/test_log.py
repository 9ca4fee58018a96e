from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from podwire.config import LogSettings
from podwire.log import get_logger, setup_logging


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_text_lines_carry_fields() -> None:
    stream = io.StringIO()
    setup_logging(LogSettings(level="INFO"), stream)
    get_logger("podwire.test").info("port.wired", port="p1", note="two words")
    get_logger("podwire.test").debug("hidden")
    line = stream.getvalue().strip()
    assert line.endswith('INFO podwire.test port.wired port=p1 note="two words"')
    assert "hidden" not in stream.getvalue()


def test_json_lines_parse() -> None:
    stream = io.StringIO()
    setup_logging(LogSettings(level="DEBUG", format="json"), stream)
    get_logger("podwire.test").warning("etcd.retry", delay=0.5)
    body = json.loads(stream.getvalue())
    assert (body["event"], body["level"], body["delay"]) == ("etcd.retry", "WARNING", 0.5)
