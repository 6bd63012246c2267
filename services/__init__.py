"""The one backend of InstantStart.

Every face (REST, dashboard panes, MCP via REST) calls into this package; validation and business rules
live here and nowhere else. Nothing in here knows whether it talks to AWS or to the sandbox: endpoints and
kubeconfigs, decided in ``app/``, make that choice.
"""

__version__ = "0.1.0"
