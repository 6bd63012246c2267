"""Conformance tests of the sandbox Kubernetes API emulator (sandbox/kube)."""
