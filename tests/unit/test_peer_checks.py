"""The pure parts of the peer tracker: what makes a claim count, and the refusal log budget."""

from __future__ import annotations

from podwire.agent.fabric.peers import BoundPort, LogBudget, check_claim
from podwire.schema.nodes import PortState

NET = "7e57a11e-0000-4000-8000-000000000001"
BOUND = BoundPort(NET, "fa:16:3e:00:00:01", frozenset({"10.0.0.5", "fd00::5"}))


def test_a_claim_counts_only_as_neutron_bound_it() -> None:
    assert check_claim(PortState(0.0), BOUND) is None  # the binding says the rest
    assert check_claim(PortState(1.0, NET, "FA:16:3E:00:00:01", ("10.0.0.5",)), BOUND) is None
    assert "bound" in (check_claim(PortState(0.0), None) or "")
    other_net = "7e57a11e-0000-4000-8000-000000000002"
    assert "network" in (check_claim(PortState(0.0, other_net), BOUND) or "")
    assert "MAC" in (check_claim(PortState(0.0, NET, "fa:16:3e:00:00:02"), BOUND) or "")
    extra = PortState(0.0, NET, None, ("10.0.0.5", "10.0.0.6"))
    assert "10.0.0.6" in (check_claim(extra, BOUND) or "")


def test_the_log_budget_holds_back_past_its_lines_and_tells_how_many() -> None:
    budget = LogBudget(2, 3600.0)
    assert [budget.allow("a") for _ in range(5)] == [True, True, False, False, False]
    assert budget.allow("b")  # per node
    assert budget.take_suppressed("a") == 3 and budget.take_suppressed("a") == 0
