"""The node agent (docs/agent.md): binder, registration, CNI server, optional device plugin."""
