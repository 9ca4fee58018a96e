"""docs/configuration.md is generated from the settings classes, so it cannot drift from them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

from podwire import config
from podwire.cli.config_reference import field_comments, render, section_doc

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_page_is_what_the_settings_classes_generate() -> None:
    assert PAGE.read_text() == render(), (
        "docs/configuration.md is stale: run"
        " .venv/bin/podwire config reference > docs/configuration.md"
    )


def test_every_setting_is_described_and_listed_with_its_default() -> None:
    page = render()
    for key in config.TOP_LEVEL:
        assert f"| `{key}` |" in page
    for section in dataclasses.fields(config.Settings):
        if section.name in config.TOP_LEVEL:
            continue
        cls = typing.get_type_hints(config.Settings)[section.name]
        assert section_doc(cls), f"[{section.name}] has no docstring"
        comments = field_comments(cls)
        assert f"## `[{section.name}]`" in page
        for item in dataclasses.fields(cls):
            assert comments.get(item.name), f"{section.name}.{item.name} has no comment"
            assert f"| `{item.name}` |" in page


def test_a_field_is_described_by_the_comment_above_it_and_at_the_end_of_its_line() -> None:
    comments = field_comments(config.PoolSettings)
    assert comments["max"] == "Most ports a pool holds; 0: no limit."
    assert comments["idle_ttl"] == "seconds without a request before a pool shrinks to min"
    assert comments["binding_retries"].startswith("Rebinds tried for a new port")
    assert "Rebinds" not in comments["adaptive"]  # a field's own comment, not the one before


def test_podwire_config_reference_prints_the_page() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "podwire.cli.main", "config", "reference"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert printed == render()
