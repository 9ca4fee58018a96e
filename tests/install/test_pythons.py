"""Which Pythons podwire installs on: one list, and a clear refusal of any other."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CLASSIFIED = [
    c.rsplit(" :: ", 1)[1]
    for c in PROJECT["classifiers"]
    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
]


def test_requires_python_the_classifiers_and_the_ci_list_agree() -> None:
    allowed = SpecifierSet(PROJECT["requires-python"])
    assert [f"3.{m}" for m in range(6, 20) if f"3.{m}.0" in allowed] == CLASSIFIED
    listed = subprocess.run(
        [ROOT / "scripts" / "pick-python", "--list"], capture_output=True, text=True, check=True
    )
    assert listed.stdout.split() == CLASSIFIED


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("3.10", "Python 3.10 is not supported"),
        ("3.14", "Python 3.14 is not supported"),
        ("2.7", "Python 2.7 is not supported"),
        ("latest", "--python wants a version like 3.12, got 'latest'"),
    ],
)
def test_an_unsupported_python_gets_one_line_and_nothing_is_made(version: str, reason: str) -> None:
    result = subprocess.run(
        [ROOT / "scripts" / "test", "--python", version], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.rstrip("\n")]
    assert result.stderr.startswith(f"setup: {reason}")
    if "not supported" in reason:
        assert result.stderr.rstrip().endswith(f"podwire supports {', '.join(CLASSIFIED)}")
    assert not (ROOT / f".venv-{version}").exists()


def test_an_unsupported_default_python3_is_refused_too(tmp_path: Path) -> None:
    """What a machine whose python3 is too old sees from plain ``scripts/setup``."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 3.10\n")  # answers the version probe like Python 3.10
    fake.chmod(0o755)
    result = subprocess.run(
        [ROOT / "scripts" / "setup"],
        capture_output=True,
        text=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "setup: python3 is Python 3.10, which podwire does not support;"
        f" use --python X.Y with one of {', '.join(CLASSIFIED)}"
    ]


def test_setup_refuses_arguments_it_does_not_know() -> None:
    result = subprocess.run(
        [ROOT / "scripts" / "setup", "--pyhton", "3.12"], capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (2, "setup: usage: scripts/setup [--python X.Y]\n")
