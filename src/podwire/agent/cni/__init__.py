"""The agent's side of the CNI protocol: the socket server the plugin talks to, the requests
it reads and the results it writes (``cni_handler`` acts on them)."""
