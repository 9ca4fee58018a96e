"""Security groups and port security on the node: store, compiler, ruleset, enforcer."""
