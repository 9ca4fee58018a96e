"""The README is the front page: short, and every link in it leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_front_page_stays_under_12_kb() -> None:
    assert len(README.read_bytes()) < 12 * 1024


def test_every_relative_link_names_a_file_of_the_repository() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the front page links to the docs"
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_it_opens_with_the_two_commands() -> None:
    text = README.read_text()
    first_block = text[text.index("```sh") : text.index("```", text.index("```sh") + 5)]
    assert "scripts/demo" in first_block and "scripts/test" in first_block
