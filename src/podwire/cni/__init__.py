"""The CNI side of podwire: the spec's wire formats, the agent's socket server, the plugin."""
