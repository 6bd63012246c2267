"""The REST route table and the dashboard's pages: the single source of the HTTP API, its OpenAPI document,
the MCP tools and the navigation. Each noun's module in ``app/api/`` exports its ``ROUTES`` (and
``PAGES``); this module only puts them in order and checks the table.

A route names its method and path, the least role it needs (read from the verb it calls), its query and
body models, its response model and how an agent should treat it (read-only, destructive, idempotent).
Handlers are thin: they take parsed models and call one verb. Handlers run in a worker thread (never on
the Tornado loop), except the async ones, which only await.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from app.api import (
    audit,
    backups,
    clusters,
    downloads,
    events,
    features,
    groups,
    inference,
    inference_managed,
    inference_obs,
    inference_pool,
    inference_router,
    inference_scaling,
    jobs,
    logs,
    metrics,
    mlflow,
    nodes,
    operations,
    recipes,
    system,
    tokens,
)
from app.api.base import Route
from app.api.pages import Page
from services.errors import ERROR_CODES, Invalid
from services.replies import Accepted


class ErrorBody(BaseModel):
    code: str = Field(..., description="internal: an unclassified failure (a bug, please report it); "
                      "permanent: a classified failure that retrying will not fix; transient: retry later",
                      json_schema_extra={"enum": list(ERROR_CODES)})
    message: str
    details: Any = None


class ErrorEnvelope(BaseModel):
    error: ErrorBody


ROUTES: list[Route] = [*system.ROUTES, *operations.ROUTES, *audit.ROUTES, *tokens.ROUTES, *backups.ROUTES,
                       *clusters.ROUTES, *events.ROUTES, *groups.ROUTES, *features.ROUTES, *nodes.ROUTES,
                       *recipes.ROUTES, *jobs.ROUTES, *logs.ROUTES, *downloads.ROUTES, *inference.ROUTES,
                       *mlflow.ROUTES, *inference_scaling.ROUTES, *inference_managed.ROUTES, *inference_obs.ROUTES,
                       *inference_router.ROUTES, *inference_pool.ROUTES,
                       *metrics.ROUTES]

PAGES: list[Page] = [*operations.PAGES, *clusters.PAGES, *groups.PAGES, *nodes.PAGES, *jobs.PAGES, *features.PAGES,
                     *downloads.PAGES, *inference.PAGES, *mlflow.PAGES, *metrics.PAGES, *audit.PAGES, *backups.PAGES]


def check_routes(routes: list[Route]) -> None:
    """Fail fast on a malformed table: duplicate tool names or (method, path) pairs."""
    names = [r.name for r in routes]
    if len(set(names)) != len(names):
        raise Invalid(f"duplicate route names in {names}")
    keys = [(r.method, r.path) for r in routes]
    if len(set(keys)) != len(keys):
        raise Invalid(f"duplicate routes in {keys}")
    for r in routes:
        if not r.read_only and r.method == "GET":
            raise Invalid(f"route {r.name} mutates with GET")
        if r.response is Accepted and r.read_only:
            raise Invalid(f"route {r.name} starts an operation, so it is not read-only")


check_routes(ROUTES)
