"""How the ``podwire`` command ends on an error podwire raised on purpose."""

from __future__ import annotations

import pytest

from podwire.errors import ConfigError


def test_cli_reports_the_permanent_error_inside_a_task_group(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permanent error that ended a TaskGroup still exits with one line, not a traceback."""
    from podwire.cli import main as cli

    def handler(_args: object) -> int:
        inner = ExceptionGroup("term", [ConfigError("pool.min: expected int, got str")])
        raise ExceptionGroup("service", [inner])

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser.set_defaults(handler=handler)
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for sub in action.choices.values():  # type: ignore[union-attr]
            sub.set_defaults(handler=handler)
    assert cli.main(["status"]) == 2
    assert capsys.readouterr().err == "podwire status: error: pool.min: expected int, got str\n"
