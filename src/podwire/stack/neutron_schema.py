"""Create Neutron's tables (and podwire's) from the models, once per database.

``neutron-db-manage`` runs hundreds of migrations; the local stack only needs the final
schema, which ``metadata.create_all`` builds in a few seconds. Real deployments use the
migrations (and podwire's alembic branch).

One migration also writes data the API depends on: the templates of the rules Neutron gives
every new security group (egress to anywhere; for a project's default group also ingress from
its own members). Without them every group would start empty, which no deployment has, so
``create_schema`` seeds the same four templates.
"""

from __future__ import annotations

import sys
import uuid

import sqlalchemy
from neutron.db.migration.models import head
from neutron.db.models.securitygroup_default_rules import SecurityGroupDefaultRule
from sqlalchemy import orm

import podwire.ml2.journal  # noqa: F401  (registers podwire's journal table in the metadata)

# (direction, ethertype, remote group, used in default groups, used in other groups);
# "PARENT" is Neutron's placeholder for the group the rule is created in.
RULE_TEMPLATES = (
    ("egress", "IPv4", None, True, True),
    ("egress", "IPv6", None, True, True),
    ("ingress", "IPv4", "PARENT", True, False),
    ("ingress", "IPv6", "PARENT", True, False),
)


def create_schema(url: str) -> None:
    engine = sqlalchemy.create_engine(url)
    try:
        head.get_metadata().create_all(engine)
        seed_rule_templates(engine)
    finally:
        engine.dispose()


def seed_rule_templates(engine: sqlalchemy.Engine) -> None:
    with orm.Session(engine) as session, session.begin():
        if session.query(SecurityGroupDefaultRule).count():
            return
        for direction, ethertype, remote_group, in_default, in_others in RULE_TEMPLATES:
            template = SecurityGroupDefaultRule(
                id=str(uuid.uuid4()),
                direction=direction,
                ethertype=ethertype,
                remote_group_id=remote_group,
                used_in_default_sg=in_default,
                used_in_non_default_sg=in_others,
            )
            template.description = "podwire stack: Neutron's legacy default rule"
            session.add(template)


if __name__ == "__main__":
    create_schema(sys.argv[1])
