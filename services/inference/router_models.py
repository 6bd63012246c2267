"""Models of the SGLang router in front of a self-managed deployment: the request (policy and its knobs, with the
ranges the router accepts), the stored plan and reference, and the view every face shows."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from services.inference.models import NAME_PATTERN, ServiceView
from services.models import RequestModel, ResponseModel

Policy = Literal["cache_aware", "round_robin", "random", "power_of_two"]
FLAGS_FILE = Path(__file__).with_name("router_flags.yaml")


@functools.cache
def router_flags() -> dict[str, Any]:
    """The router's CLI as data (``router_flags.yaml``: its flags, choices and the defaults of its knobs)."""
    loaded: dict[str, Any] = yaml.safe_load(FLAGS_FILE.read_text())
    return loaded


DEFAULTS: dict[str, Any] = router_flags()["defaults"]


class RouterKnobs(RequestModel):
    """The routing policy and its knobs (the pinned router's own defaults, from ``router_flags.yaml``, when not
    given)."""

    policy: Policy = Field(
        DEFAULTS["--policy"], description="'cache_aware': requests sharing a prefix go to the worker that served it "
        "(its KV cache holds it), unless load is too uneven; 'round_robin', 'random', 'power_of_two' (the less "
        "loaded of two random workers)")
    cache_threshold: float = Field(
        DEFAULTS["--cache-threshold"], ge=0.0, le=1.0, description="cache_aware: the share of the request's prefix "
        "a worker must already hold to be chosen for it (0.0-1.0); below it the worker with the smallest cache tree "
        "is chosen")
    balance_abs_threshold: int = Field(
        DEFAULTS["--balance-abs-threshold"], ge=0, le=100_000, description="cache_aware: load balancing takes over "
        "when the busiest worker has this many more running requests than the idlest ...")
    balance_rel_threshold: float = Field(
        DEFAULTS["--balance-rel-threshold"], ge=1.0, le=1000.0, description="... and more than this many times as "
        "many (both must hold)")
    eviction_interval_secs: int = Field(
        DEFAULTS["--eviction-interval-secs"], ge=1, le=86_400, description="cache_aware: seconds between evictions "
        "of the prefix tree down to max_tree_size")
    max_tree_size: int = Field(
        DEFAULTS["--max-tree-size"], ge=1, le=2 ** 31, description="cache_aware: the prefix tree's size (characters "
        "per worker) kept at each eviction")


class RouterRequest(RouterKnobs):
    """An SGLang router in front of one self-managed deployment: it discovers the deployment's pods by label
    selector and routes OpenAI-compatible requests to them."""

    name: str = Field(..., pattern=NAME_PATTERN, description="the router's name: a DNS label of at most 40 "
                      "characters, also its Service's, ServiceAccount's and Role's name")
    deployment: str = Field(..., pattern=NAME_PATTERN, description="the inference deployment whose pods are the "
                            "workers (inference_list), or a model pool (inference_pool_list) with pool_service; the "
                            "router runs in its namespace")
    pool_service: str | None = Field(None, pattern=NAME_PATTERN, description="only when deployment is a model "
                                     "pool: the pool's service whose pods are the workers (the pool's pods labelled "
                                     "business=<service>, inference_pool_get lists them), so assigning or releasing "
                                     "pods changes the router's workers")


class RouterUpdate(RequestModel):
    """New policy knobs: the router's Deployment rolls out with the new command (its prefix tree starts empty)."""

    policy: Policy | None = None
    cache_threshold: float | None = Field(None, ge=0.0, le=1.0)
    balance_abs_threshold: int | None = Field(None, ge=0, le=100_000)
    balance_rel_threshold: float | None = Field(None, ge=1.0, le=1000.0)
    eviction_interval_secs: int | None = Field(None, ge=1, le=86_400)
    max_tree_size: int | None = Field(None, ge=1, le=2 ** 31)


class RouterPlan(RequestModel):
    """What an ``inference.router.create``/``.update`` operation stores: the rendered objects, in apply order."""

    cluster: str
    name: str
    namespace: str
    deployment: str
    pool_service: str | None = None
    knobs: RouterKnobs
    manifests: list[dict[str, Any]] = Field(..., description="ServiceAccount, Role, RoleBinding, Deployment, "
                                            "Service (an update: the Deployment only)")
    requested_by: str


class RouterRef(RequestModel):
    """What an ``inference.router.delete`` operation stores."""

    cluster: str
    name: str
    namespace: str
    uid: str = Field(..., description="the router Deployment's uid when the delete was asked: only that one goes "
                                      "(empty: it was already gone, and the router's other objects go)")
    requested_by: str


class RouterPreview(ResponseModel):
    """What a router create would make, checked by the API server (dry run); nothing is created."""

    command: list[str]
    selector: str = Field(..., description="the label selector the router discovers its workers by")
    worker_port: int
    manifests: list[dict[str, Any]]


class WorkerView(ResponseModel):
    pod: str
    phase: str | None = None
    ready: bool | None = Field(None, description="whether the pod is Ready (a worker the router sends to); "
                               "inference_routers_get reads it, the list does not")
    requests: int | None = Field(None, description="requests the router sent it (sgl_router_processed_requests_"
                                 "total), when its metrics were read")


class RouterView(ResponseModel):
    """One router as every face shows it."""

    name: str
    namespace: str
    cluster: str
    deployment: str
    pool_service: str | None = Field(None, description="the model pool's service whose pods are the workers, when "
                                     "deployment is a pool")
    knobs: RouterKnobs | None = None
    selector: str = ""
    phase: Literal["Available", "Progressing", "Failed", "Orphaned"] = Field(
        "Progressing", description="'Orphaned': the router's Deployment is gone and other objects of it are left "
        "(listed in left): inference_routers_delete removes them")
    message: str = ""
    left: list[str] = Field(default_factory=list, description="Orphaned: the kinds of the router's objects still "
                            "there (the list sees its Service in the cache; inference_routers_get reads all live)")
    workers: list[WorkerView] = Field(default_factory=list)
    requests_total: int | None = Field(None, description="inference requests the router received (sgl_router_"
                                       "requests_total of the completions and generate routes; not its probes), "
                                       "when its metrics were read")
    active_workers: int | None = Field(None, description="the workers the router itself has discovered "
                                       "(sgl_router_active_workers), when its metrics were read")
    cache_hits: int | None = None
    cache_misses: int | None = None
    metrics_error: str | None = Field(None, description="why the metrics could not be read, when they could not")
    service: ServiceView | None = None


class RouterList(ResponseModel):
    cluster: str
    routers: list[RouterView]
