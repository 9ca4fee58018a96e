"""docs/architecture.md §4 against the code: the rules a tool can check are checked here.

The layers table and the third-party table are read from the page itself, so the page cannot
drift from pyproject.toml's contracts, nor the contracts from what src/ imports.
"""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from collections import defaultdict
from pathlib import Path

from podwire import keys

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "podwire"
DOC = ROOT / "docs" / "architecture.md"
GENERATED = {"generated"}  # gRPC stubs made by scripts/gen-protos


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _sources() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if not GENERATED & set(p.parts)]


def _table_after(marker: str) -> list[list[str]]:
    """The cells of the first Markdown table after ``marker`` in the page."""
    text = DOC.read_text()
    assert marker in text, f"docs/architecture.md lost {marker!r}"
    rows = []
    for line in text[text.index(marker) :].splitlines()[1:]:
        line = line.strip()
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if not set(cells[0]) <= {"-", ":"}:
            rows.append(cells)
    return rows[1:]  # without the header


def _names(cell: str) -> list[str]:
    """The backquoted names of a cell, leaving out what is said in parentheses."""
    return re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cell))


def test_every_class_name_is_used_once() -> None:
    where = defaultdict(list)
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert {name: places for name, places in where.items() if len(places) > 1} == {}


def test_the_layers_table_lists_the_import_contract() -> None:
    (contract,) = [
        c for c in _pyproject()["tool"]["importlinter"]["contracts"] if c["type"] == "layers"
    ]
    in_contract = [
        sorted(m.strip().removeprefix("podwire.") for m in layer.split(":"))
        for layer in contract["layers"]
    ]
    in_doc = [sorted(_names(cells[1])) for cells in _table_after("- **Layers**")]
    assert in_doc == list(reversed(in_contract))  # the page lists models first


def _confinement() -> dict[str, list[str]]:
    table = _table_after("- **Third parties are contained**")
    return {_names(cells[0])[0]: _names(cells[1]) for cells in table}


def test_the_third_party_table_is_what_ruff_bans_and_exempts() -> None:
    ruff = _pyproject()["tool"]["ruff"]["lint"]
    banned = set(ruff["flake8-tidy-imports"]["banned-api"])
    exempt = {
        path.removeprefix("src/podwire/").removesuffix("**")
        for path, codes in ruff["per-file-ignores"].items()
        if path.startswith("src/podwire/") and "TID251" in codes
    }
    confinement = _confinement()
    assert set(confinement) == banned
    assert {place for places in confinement.values() for place in places} == exempt


def test_each_third_party_library_is_imported_only_where_its_row_says() -> None:
    confinement = _confinement()
    outside = []
    for path in _sources():
        relative = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                places = confinement.get(module.split(".")[0], [relative])
                if not any(
                    relative == p or (p.endswith("/") and relative.startswith(p)) for p in places
                ):
                    outside.append(f"{relative}:{node.lineno} imports {module}")
    assert outside == []


def test_no_wait_for_that_could_swallow_a_cancellation() -> None:
    """§4 Concurrency: timeouts are ``asyncio.timeout``. On Python 3.11 ``asyncio.wait_for``
    returns normally when a cancellation arrives as its awaitable completes, and a loop around
    it then never ends (an agent that would not stop); ruff's ban cannot reach the packages it
    exempts, so the rule is checked here."""
    found = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "wait_for"
        and isinstance(node.value, ast.Name) and node.value.id == "asyncio"
    ]  # fmt: skip
    assert found == []


def test_the_key_table_shows_every_key_podwire_builds() -> None:
    """§3: the page's key layout is where an operator looks for a key; a key builder added to
    ``keys`` without its row there (the agent's memif key once) is caught here."""
    text = DOC.read_text()
    block = text[text.index("## 3. Where values live") :]
    block = block[block.index("```") + 3 :]
    rows = [line.split()[0] for line in block[: block.index("```")].splitlines() if line.strip()]
    patterns = [re.compile(re.sub(r"<[^>]+>", "[^/]+", row) + "$") for row in rows]
    built = [keys.KICK]
    for name, builder in inspect.getmembers(keys, inspect.isfunction):
        if name.endswith("prefix") or name.startswith(("parse_", "check_")):
            continue
        params = inspect.signature(builder).parameters
        built.append(builder(*("a:b" if p == "attachment" else "x" for p in params)))
    assert [key for key in built if not any(p.match(key) for p in patterns)] == []
