"""The memif master: one process per node, started by the agent, serving the memif of every
pod that holds a grant (docs/memif.md).

The program itself is C (``c/podwire-memif.c``): it speaks memif's control protocol as the
master, validating every message, and copies frames between each client's rings and its tap,
or ring to ring on the shared path. It is compiled on the machine that runs it, like the CNI
plugin (``build.py``). ``master.py`` starts, recognises and stops it and speaks its control
socket; the agent's memif service (``agent/ports/memif.py``) drives it through that.
"""
