"""The README's first command, end to end at a small size: what a new user sees."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from podwire.demo import cnf
from podwire.demo.kube import missing as kube_missing

pytestmark = pytest.mark.netns  # the demo's hosts and pods are network namespaces


@pytest.mark.timeout(900)  # a hang guard above the run's own: it must not kill the demo first
def test_demo_pods_reach_each_other_groups_and_policies_decide_cnf_answers_nothing_left() -> None:
    before = _demo_namespaces()
    result = subprocess.run(
        [sys.executable, "-m", "podwire.demo", "--pods", "4"],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "pod-to-pod pings: 12 of 12 answered" in out
    assert "pool hits: 6 of 6 ADDs; 2 of 2 released ports recycled into the pools" in out
    assert re.search(r"CNI ADD: p50 [\d.]+ ms, p99 [\d.]+ ms \(6 ADDs\)", out)
    # Neutron's rules decide: a reset from an open pod, silence from the locked one, then in.
    assert "nothing listening: refused; listening pod, group without that rule: timed out" in out
    assert re.search(r"rule create returned -> first connection accepted: -?\d+ ms", out)
    assert re.search(r"from a spoofed source [\d.]+ \(inside the rule's prefix\): timed out", out)
    # Through Neutron's router: east-west across hosts, SNAT, then a floating IP.
    assert re.search(
        r"pinged a pod on network 1 \(host 1\): 5 of 5 answered; it pinged the outside"
        r" through SNAT as 203\.0\.113\.\d+: answered",
        out,
    )
    assert re.search(
        r"floating IP 203\.0\.113\.\d+: associate returned -> first answer from outside \d+ ms",
        out,
    )
    # Through Kubernetes: pods made with kubectl, each on its own Neutron port.
    if kube_missing():
        assert "Kubernetes: skipped, the Kubernetes binaries are not built" in out
    else:
        assert re.search(r"4 pods through kube-apiserver Running in [\d.]+ s", out)
        assert "bound to their node: 4 of 4; pings to CNI pods on the other host: 4 of 4" in out
        assert "the podwire.io/port-id annotation names that port: 4 of 4" in out
        # A NetworkPolicy through the apiserver, enforced as a Neutron group on the port.
        assert re.search(r"policy demo-deny is Neutron security group podwire-np-\w+", out)
        assert re.search(
            r"NetworkPolicy: default deny ingress -> 0 of 3 pings answered, in force -?\d+ ms"
            r" after kubectl apply; allowing the peer by pod selector -> 3 of 3, in force",
            out,
        )
        # A Service by name across hosts: CoreDNS through kube-dns, both backends answering.
        assert re.search(
            r"Services: web\.podwire-demo\.svc\.cluster\.local -> 10\.96\.[\d.]+ \(CoreDNS.*\);"
            r" 16 of 16 connections by name from host 2 answered, by web-1, web-2;",
            out,
        )
    if not (kube_missing() or cnf.missing()):
        assert re.search(r"memif CNF pod .* pinged from host 2: \d+ of 50 answered, RTT p50", out)
    else:
        assert "memif CNF: skipped" in out
    assert out.rstrip().endswith("nothing left behind")
    assert _demo_namespaces() == before


def _demo_namespaces() -> set[str]:
    """The demo's namespaces carry its tag (pwd...); other tests may run beside it."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.startswith("pwd")}
