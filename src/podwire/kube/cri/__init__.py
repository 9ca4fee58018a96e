"""The CRI v1 RuntimeService stubs (``generated/``, from ``protos/``; run scripts/gen-protos)."""
