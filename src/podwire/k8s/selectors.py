"""Label selectors (metav1.LabelSelector) as values: read strictly, matched purely.

A selector is also a key: two policies with the same selector share one Neutron address
group, so a selector has one canonical form (``key``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podwire.schema import fields
from podwire.schema.doc import as_object

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
MAX_TERMS = 256


@dataclass(frozen=True, order=True)
class Requirement:
    """One matchExpressions term; matchLabels entries become ``In`` with one value."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # NotIn: an absent key matches


@dataclass(frozen=True)
class Selector:
    """All requirements must hold; none selects everything (``{}``)."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(term.matches(labels) for term in self.requirements)

    @property
    def key(self) -> str:
        return json.dumps([[t.key, t.operator, list(t.values)] for t in self.requirements])


EVERYTHING = Selector()


def read_selector(value: Any, what: str) -> Selector:
    """A LabelSelector; an operator or a value list the API would refuse is refused here too."""
    body = as_object(value, what)
    terms: set[Requirement] = set()
    match_labels = as_object(body.get("matchLabels") or {}, f"{what}.matchLabels")
    for key, label in match_labels.items():
        terms.add(Requirement(_label(key, what), "In", (_label(label, f"{what}.{key}"),)))
    expressions = fields.items(body.get("matchExpressions") or [], what, MAX_TERMS)
    for index, item in enumerate(expressions):
        terms.add(_requirement(item, f"{what}.matchExpressions[{index}]"))
    return Selector(tuple(sorted(terms)))


def _requirement(value: Any, what: str) -> Requirement:
    body = as_object(value, what)
    operator = fields.one_of(body.get("operator"), f"{what}.operator", OPERATORS)
    raw = fields.items(body.get("values") or [], f"{what}.values", MAX_TERMS)
    values = tuple(sorted({_label(item, f"{what}.values") for item in raw}))
    if operator in ("In", "NotIn") and not values:
        raise fields.fail(what, f"{operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise fields.fail(what, f"{operator} takes no values")
    return Requirement(_label(body.get("key"), f"{what}.key"), operator, values)


def _label(value: Any, what: str) -> str:
    """Label keys and values as text: the API validated their syntax, podwire only compares."""
    return fields.text(value, what, 317)


def read_labels(value: Any, what: str) -> dict[str, str]:
    body = as_object(value if value is not None else {}, what)
    return {_label(key, what): _label(label, f"{what}.{key}") for key, label in body.items()}
