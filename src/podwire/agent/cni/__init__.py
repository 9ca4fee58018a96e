"""The agent's side of CNI: the socket server the plugin talks to, the requests it reads, the
results it writes and the handler that attaches and detaches."""
