"""Composition root, server and CLI: the only place that wires services, faces and configuration."""
