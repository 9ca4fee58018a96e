"""A journal table of a test's or benchmark's own, beside Neutron's: Neutron's forwarders
leave its rows alone, so a forwarder under test drains only what the test put there.

Production has one journal table, made by Neutron's migrations; copies exist only here.
"""

from __future__ import annotations

import sqlalchemy as sa

from podwire.ml2.journal import JournalRow


def copy_table(name: str) -> sa.Table:
    """A table shaped like the journal, named ``name`` (create it with the journal's
    ``create_table``)."""
    table: sa.Table = JournalRow.__table__.to_metadata(sa.MetaData(), name=name)
    return table


def drop_table(url: str, table: sa.Table) -> None:
    """Remove a copy once its journal is closed."""
    engine = sa.create_engine(url)
    try:
        table.drop(engine, checkfirst=True)
    finally:
        engine.dispose()
