"""The memif master podwire's agent runs for each pod holding a memif grant (docs/memif.md).

The program itself is C (``c/podwire-memif.c``): it speaks memif's control protocol as the
master, validating every message, and copies frames between the client's rings and a tap. It
is compiled on the machine that runs it, like the CNI plugin.
"""
