"""constraints.txt: the pinned versions the suite runs with, one file for every Python."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
MERGE = ROOT / "scripts" / "merge_constraints.py"


def pins_for_this_python(text: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate():
                (spec,) = req.specifier
                assert spec.operator == "==", line
                pins[canonicalize_name(req.name)] = spec.version
    return pins


def installed_closure(root: str, extras: set[str]) -> dict[str, str]:
    """Every distribution ``root[extras]`` needs here, with its installed version."""
    found: dict[str, str] = {}
    todo = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        if key in found and not wanted:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # an optional dependency nobody here asked for
        found[key] = dist.version
        for raw in dist.requires or []:
            req = Requirement(raw)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, set(req.extras)))
    return found


def test_this_venv_runs_exactly_the_pinned_versions() -> None:
    pins = pins_for_this_python((ROOT / "constraints.txt").read_text())
    installed = installed_closure("podwire", {"dev"})
    del installed["podwire"]
    wrong = {
        name: (version, pins.get(name, "not pinned"))
        for name, version in installed.items()
        if pins.get(name) != version
    }
    assert wrong == {}, "installed vs constraints.txt; run scripts/refresh-constraints"
    assert "podwire" not in pins


def _merge(tmp_path: Path, freezes: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args = []
    for python, text in freezes.items():
        path = tmp_path / f"{python}.txt"
        path.write_text(text)
        args.append(f"{python}={path}")
    return subprocess.run([sys.executable, MERGE, *args], capture_output=True, text=True)


def test_merge_marks_only_the_pins_that_differ_between_pythons(tmp_path: Path) -> None:
    freezes = {
        "3.11": "aetcd==1.0.0\nWebOb==1.8.9\n",
        "3.12": "aetcd==1.0.0\nwebob==1.8.9\n",
        "3.13": "aetcd==1.0.0\nWebOb==1.8.11\nlegacy-cgi==2.6.4\n",
    }
    result = _merge(tmp_path, freezes)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert lines == [
        "aetcd==1.0.0",
        'legacy-cgi==2.6.4 ; python_version == "3.13"',
        'WebOb==1.8.11 ; python_version == "3.13"',
        'WebOb==1.8.9 ; python_version == "3.11" or python_version == "3.12"',
    ]
    for python, text in freezes.items():
        env = {"python_version": python}
        chosen = {
            canonicalize_name(r.name): str(r.specifier)
            for r in map(Requirement, lines)
            if r.marker is None or r.marker.evaluate(env)
        }
        expected = {
            canonicalize_name(n): f"=={v}" for n, v in (p.split("==") for p in text.split())
        }
        assert chosen == expected, python


def test_merge_rejects_what_is_not_a_plain_pin(tmp_path: Path) -> None:
    result = _merge(tmp_path, {"3.11": "aetcd==1.0.0\n-e git+https://example.invalid/x\n"})
    assert result.returncode != 0
    assert (
        "3.11.txt:2: not a 'name==version' pin: -e git+https://example.invalid/x" in result.stderr
    )
    bad = subprocess.run([sys.executable, MERGE, "freeze.txt"], capture_output=True, text=True)
    assert "expected PYTHON=FREEZE_FILE" in bad.stderr
