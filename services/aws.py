"""AWS client factory: one place that knows region, endpoint, retries and our user agent.

Stateless apart from a cache of thread-safe boto3 clients. An endpoint override (the sandbox, a VPC
endpoint, a proxy) is configuration; nothing downstream knows the difference.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import boto3
from botocore.config import Config

from services import __version__


class AwsClients:
    def __init__(self, region: str, endpoint_url: str | None = None, session: boto3.Session | None = None,
                 max_attempts: int = 5) -> None:
        self.region = region
        self.endpoint_url = endpoint_url
        self.session = session or boto3.Session()
        self.config = Config(
            region_name=region,
            retries={"mode": "standard", "max_attempts": max_attempts},
            user_agent_extra=f"instantstart/{__version__}",
            connect_timeout=10,
            read_timeout=60,
        )
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def client(self, service: str, region: str | None = None) -> Any:
        """A cached boto3 client for ``service`` in ``region`` (default: the configured region)."""
        key = (service, region or self.region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = cast(Any, self.session).client(service, region_name=key[1], endpoint_url=self.endpoint_url,
                                             config=self.config)
                self._clients[key] = client
        return client
