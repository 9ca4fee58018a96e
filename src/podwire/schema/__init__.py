"""The one schema of every value podwire exchanges: one reader and one writer per value.

One writer is elsewhere on purpose: ml2's ``policy.group_value`` puts a security group's
rules in itself, so a rule this schema refuses still reaches the agents in Neutron's own fields
(and the reader names it and leaves it out, which only ever denies more).

``fields`` defines each kind of field (names, ids, MACs, addresses, ranges) once; ``doc``
decodes JSON with bounds and a schema version; the other modules are the values themselves:
``ports`` (desired bindings), ``nodes`` (what agents publish), ``records`` (the servers'
records), ``inuse`` (a port in use as the controller holds it, and its pool's key), ``vif``
(the VIF API and the in-use records' VIFs), ``secgroups`` (security-group policy). Every
component reads and writes these values only through here; the CNI network config is read by
``agent.cni.request`` with these fields, because its errors carry CNI's own codes.
"""
