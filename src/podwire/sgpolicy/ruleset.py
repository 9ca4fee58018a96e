"""A compiled nftables ruleset as plain values, and the nft text that installs or changes it.

The compiler produces a ``Ruleset`` (pure data: chains of typed rules, ``rules.py``, and sets
of typed elements); this module turns it into one nft buffer: ``replace`` swaps podwire's
tables whole (the agent's first application, e.g. after a restart: packets see the old tables
or the new ones, never neither), ``change`` moves the kernel from one ruleset to the next with
as few commands as it can (set elements and the chains that changed), which keeps a rule or
member change cheap however large the node's ruleset is. Both are applied as one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from podwire.netfilter.elements import Element, ElementChange
from podwire.sgpolicy import rules as chain_rules
from podwire.sgpolicy.rules import ChainRule

TABLE = "podwire"
FAMILIES = ("bridge", "inet")


@dataclass(frozen=True)
class NftSet:
    """A named set or map: ``spec`` is its declaration body."""

    family: str
    name: str
    spec: str
    elements: frozenset[Element] = frozenset()


@dataclass(frozen=True)
class NftChain:
    """A chain; ``hook`` is the base-chain declaration (empty for a regular chain)."""

    family: str
    name: str
    rules: tuple[ChainRule, ...]
    hook: str = ""


@dataclass
class Ruleset:
    sets: dict[tuple[str, str], NftSet] = field(default_factory=dict)
    chains: dict[tuple[str, str], NftChain] = field(default_factory=dict)

    def add_set(self, item: NftSet) -> None:
        self.sets[(item.family, item.name)] = item

    def add_chain(self, item: NftChain) -> None:
        self.chains[(item.family, item.name)] = item


def _where(family: str, name: str) -> str:
    return f"{family} {TABLE} {name}"


def _kind(item: NftSet) -> str:
    return "map" if " : " in item.spec else "set"


def _declare_set(item: NftSet) -> str:
    return f"add {_kind(item)} {_where(item.family, item.name)} {{ {item.spec} }}"


def _declare_chain(item: NftChain) -> str:
    body = f" {{ {item.hook} }}" if item.hook else ""
    return f"add chain {_where(item.family, item.name)}{body}"


def _elements(verb: str, item: NftSet, elements: frozenset[Element]) -> list[ElementChange]:
    if not elements:
        return []
    return [ElementChange(item.family, TABLE, item.name, item.spec, verb, elements)]


def _rules(item: NftChain) -> list[str]:
    where = _where(item.family, item.name)
    return [f"add rule {where} {chain_rules.text(rule)}" for rule in item.rules]


def replace(new: Ruleset) -> str:
    """Drop podwire's tables and build them again, in one transaction."""
    lines: list[str] = []
    for family in FAMILIES:
        # "add" first makes "delete" valid when the table is not there yet.
        lines += [f"add table {family} {TABLE}", f"delete table {family} {TABLE}"]
        lines.append(f"add table {family} {TABLE}")
    lines += _build(new, list(new.sets), list(new.chains), set(new.chains))
    return "\n".join(lines) + "\n"


def _build(
    new: Ruleset,
    set_keys: list[tuple[str, str]],
    chain_keys: list[tuple[str, str]],
    refill: set[tuple[str, str]],
) -> list[str]:
    """Declarations, then elements (maps name chains), then rules (rules name sets)."""
    lines = [_declare_set(new.sets[key]) for key in sorted(set_keys)]
    lines += [_declare_chain(new.chains[key]) for key in sorted(chain_keys)]
    for key in sorted(set_keys):
        lines += [e.text() for e in _elements("add", new.sets[key], new.sets[key].elements)]
    for key in sorted(refill):
        lines += _rules(new.chains[key])
    return lines


@dataclass
class Change:
    """The commands from one ruleset to the next: when only set elements change (a pod's ADD
    or DEL, a member), ``elements`` is all of it and can go to the kernel without nft text."""

    before: list[str]  # declarations and flushes
    elements: list[ElementChange]  # deletes, then adds
    after: list[str]  # rules, then removals

    @property
    def elements_only(self) -> bool:
        return not self.before and not self.after

    def text(self) -> str:
        lines = [*self.before, *(e.text() for e in self.elements), *self.after]
        return "\n".join(lines) + "\n" if lines else ""


def change(old: Ruleset, new: Ruleset) -> Change | None:
    """What turns ``old`` into ``new`` (empty when nothing differs); None when a set changed
    its declaration (then ``replace`` is the way)."""
    for key, item in new.sets.items():
        had = old.sets.get(key)
        if had is not None and had.spec != item.spec:
            return None
    for key, chain in new.chains.items():
        was = old.chains.get(key)
        if was is not None and was.hook != chain.hook:
            return None
    added_sets = [key for key in new.sets if key not in old.sets]
    added_chains = [key for key in new.chains if key not in old.chains]
    changed = {
        key
        for key, chain in new.chains.items()
        if key in old.chains and old.chains[key].rules != chain.rules
    }
    before = [_declare_set(new.sets[key]) for key in sorted(added_sets)]
    before += [_declare_chain(new.chains[key]) for key in sorted(added_chains)]
    before += [f"flush chain {_where(*key)}" for key in sorted(changed)]
    after = [
        line for key in sorted(changed | set(added_chains)) for line in _rules(new.chains[key])
    ]
    return Change(before, _element_changes(old, new), after + _removals(old, new))


def _element_changes(old: Ruleset, new: Ruleset) -> list[ElementChange]:
    deletes: list[ElementChange] = []
    adds: list[ElementChange] = []
    for key, item in sorted(new.sets.items()):
        before = old.sets.get(key)
        if before is item:
            continue
        had = before.elements if before is not None else frozenset()
        deletes += _elements("delete", item, had - item.elements)
        adds += _elements("add", item, item.elements - had)
    return deletes + adds


def _removals(old: Ruleset, new: Ruleset) -> list[str]:
    """Removed chains are emptied first (their rules name sets), then the removed sets go
    (a map's elements name chains), then the chains."""
    chains = sorted(k for k in old.chains if k not in new.chains)
    lines = [f"flush chain {_where(*key)}" for key in chains]
    lines += [
        f"delete {_kind(old.sets[key])} {_where(*key)}"
        for key in sorted(k for k in old.sets if k not in new.sets)
    ]
    lines += [f"delete chain {_where(*key)}" for key in chains]
    return lines
