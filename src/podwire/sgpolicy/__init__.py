"""What a port's security groups let through, compiled to typed values and rendered to
nftables (docs/security-groups.md).

Pure but for ``readback`` (which lists podwire's tables): the cluster's policy as read from
``/podwire/global/`` (``store``), compiled with this node's ports into chains, sets and their
elements (``compile``, ``intervals``; the packet-mark bits in ``marks``), rendered as the nft
text that installs or changes them (``ruleset``). The agent's enforcer
(``agent/policy/enforcer.py``) follows etcd and applies what this package compiles; nothing
here imports the agent.
"""
