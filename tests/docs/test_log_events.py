"""The log lines the docs quote are ones podwire writes: every ``event key=...`` a page names is
an event of the code (Python or the C masters), with that key among the fields it is logged with
in that file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUOTED = re.compile(r"`([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)((?: [a-z_]+=[^ `]*)+)")


def _quoted_events() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for event, rest in QUOTED.findall(page.read_text()):
            found.setdefault(event, set()).update(re.findall(r" ([a-z_]+)=", rest))
    return found


def _sources() -> dict[Path, str]:
    src = ROOT / "src" / "podwire"
    return {p: p.read_text() for p in [*src.rglob("*.py"), *src.rglob("*.c")]}


def test_the_docs_quote_log_events() -> None:
    assert len(_quoted_events()) >= 10  # the pattern still finds what the pages quote


def test_every_quoted_event_and_field_is_logged_by_the_code() -> None:
    sources = _sources()
    wrong = []
    for event, keys in sorted(_quoted_events().items()):
        emitting = [text for text in sources.values() if f'"{event}"' in text]
        if not emitting:
            wrong.append(f"{event}: no such event in src/")
            continue
        for key in sorted(keys):
            if not any(re.search(rf"\b{key}=", text) for text in emitting):
                wrong.append(f"{event}: no field {key}= where it is logged")
    assert wrong == []
