"""The product's MLflow client for a SageMaker managed tracking server: the server's ARN is the tracking URI.

The ``sagemaker-mlflow`` plugin resolves an ARN to ``https://<region>.experiments.sagemaker.aws`` (or to
``SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT`` when set: the sandbox) and signs each request with SigV4 for the
``sagemaker-mlflow`` service. Two of its pieces read MLflow's *global* tracking URI rather than the client's
(the ``x-mlflow-sm-tracking-server-arn`` header and the signing region), and it signs with the context's
boto3 session. So every call through :func:`tracking_client` runs with the global URI set to the ARN, under
one lock (a server of the product talks to the tracking servers of several clusters), and with the product's
own boto3 session (its credentials, never the environment's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3

_LOCK = threading.RLock()


@contextmanager
def tracking_client(arn: str, session: boto3.Session) -> Iterator[Any]:
    """An ``MlflowClient`` whose calls reach tracking server ``arn``, signed with ``session``'s credentials.
    Keep the block short: it holds the process's one MLflow lock."""
    from mlflow.tracking import MlflowClient
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri
    from sagemaker_mlflow.session import use_session

    with _LOCK, use_session(session), _use_tracking_uri(arn):  # put back as it was (unset: unset) on exit
        yield MlflowClient(tracking_uri=arn)


@contextmanager
def calls_to(uri: str, session: boto3.Session | None) -> Iterator[None]:
    """Run MLflow calls of a client made for ``uri``: for a tracking server's ARN, as :func:`tracking_client`
    does (under the one lock, with the global URI set to it and signed with ``session``); any other URI (a plain
    MLflow server) needs nothing."""
    if not uri.startswith("arn:"):
        yield
        return
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri
    from sagemaker_mlflow.session import use_session

    with _LOCK, use_session(session or boto3.Session()), _use_tracking_uri(uri):
        yield
