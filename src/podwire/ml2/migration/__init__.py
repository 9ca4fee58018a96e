"""podwire's alembic branch for ``neutron-db-manage --subproject podwire upgrade head``.

The local stack builds its schema from the models; a real deployment creates the journal with
this branch, which keeps its own version table so it never collides with Neutron's history.
"""

alembic_migrations = "alembic_migrations"
