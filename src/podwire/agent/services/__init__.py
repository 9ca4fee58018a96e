"""Kubernetes Services translated in this node's pods."""
