"""The embedded sandbox world: AWS emulation, a Kubernetes API emulator, simulated workloads."""
