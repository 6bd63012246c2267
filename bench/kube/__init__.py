"""Benchmarks of the sandbox Kubernetes API emulator."""
