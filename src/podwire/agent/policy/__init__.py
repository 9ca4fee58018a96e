"""Security groups and port security on the node: the enforcer, which follows the policy in
etcd and applies what ``podwire.sgpolicy`` compiles from it."""
