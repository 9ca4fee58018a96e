"""The one schema of every value podwire exchanges: one reader and one writer per value.

``fields`` defines each kind of field (names, ids, MACs, addresses, ranges) once; ``doc``
decodes JSON with bounds and a schema version; the other modules are the values themselves:
``ports`` (desired bindings), ``nodes`` (what agents publish), ``records`` (the servers'
records), ``vif`` (the VIF API and the in-use records' VIFs), ``secgroups`` (security-group
policy). Every component reads and writes these values only through here; the CNI network
config is read by ``cni.request`` with these fields, because its errors carry CNI's own codes.
"""
