"""The README's first command, end to end at a small size: what a new user sees."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.netns  # the demo's hosts and pods are network namespaces


def test_demo_attaches_pods_that_reach_each_other_and_leaves_nothing() -> None:
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    result = subprocess.run(
        [sys.executable, "-m", "podwire.demo", "--pods", "4"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "pod-to-pod pings: 12 of 12 answered" in out
    assert "pool hits: 6 of 6 ADDs; re-created pods got 2 recycled ports back" in out
    assert re.search(r"CNI ADD: p50 [\d.]+ ms, p99 [\d.]+ ms \(6 ADDs\)", out)
    assert out.rstrip().endswith("nothing left behind")
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert sorted(after.split()) == sorted(before.split())
