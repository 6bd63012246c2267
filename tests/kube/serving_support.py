"""Helpers for the serving tests: one emulator on a fast clock with a call ledger, served over HTTP for the
official client, a GPU node per cluster, and the proxy requests the product sends."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from sandbox.kube import BackgroundServer, Cluster, Emulator
from sandbox.ledger import Ledger
from tests.kube.nodes import add_node
from tests.kube.training_support import FastClock
from tests.ledger import CallLedger

_names = itertools.count()


@dataclass
class Serving:
    emulator: Emulator
    server: BackgroundServer
    ledger: CallLedger
    tmp: Path


@dataclass
class Served:
    """One fresh cluster with a GPU node, and the official client pointed at it."""

    name: str
    cluster: Cluster
    api: client.ApiClient
    ledger: CallLedger

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    tmp = tmp_path_factory.mktemp("serving")
    ledger = Ledger(tmp / "sandbox" / "calls.jsonl")
    emulator = Emulator(None, clock=FastClock(), ledger=ledger, debounce=0.05)
    server = BackgroundServer(emulator).start()
    yield Serving(emulator, server, CallLedger(tmp), tmp)
    server.stop()
    emulator.close()
    ledger.close()


@pytest.fixture
def served(serving: Serving) -> Iterator[Served]:
    name = f"serve-{next(_names)}"
    cluster = serving.emulator.ensure_cluster(name)
    add_node(cluster, "hyperpod-i-0001", cpu="96", memory="1024Gi", gpu=8)
    path = serving.emulator.write_kubeconfig(name, serving.server.base_url, serving.tmp / f"{name}.kubeconfig")
    api = config.new_client_from_config(str(path))
    yield Served(name, cluster, api, serving.ledger)
    api.close()
    serving.emulator.delete_cluster(name)


def proxy_call(api: client.ApiClient, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """One request through the official client (its auth and transport), as a raw call: status, headers (names
    in lower case), text (an error status is returned, not raised)."""
    prepared = api.param_serialize(method, path, header_params=dict(headers or {}), body=body,
                                   auth_settings=["BearerToken"])
    response = api.call_api(*prepared[:4])
    headers_seen = {k.lower(): v for k, v in response.headers.items()}
    return response.status, headers_seen, (response.read() or b"").decode()


def chat(api: client.ApiClient, service: str, prompt: str, namespace: str = "default",
         **extra: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    status, headers, text = proxy_call(
        api, "POST", f"/api/v1/namespaces/{namespace}/services/{service}/proxy/v1/chat/completions",
        {"model": extra.pop("model", "m"), "messages": [{"role": "user", "content": prompt}], **extra},
        {"Content-Type": "application/json"})
    return status, headers, json.loads(text) if text.startswith("{") else {"text": text}
