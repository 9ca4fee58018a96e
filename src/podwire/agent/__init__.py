"""The node agent (DESIGN §4): binder, registration, CNI server, optional device plugin."""
