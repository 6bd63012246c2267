"""The SGLang router as a simulated container program (``python3 -m sglang_router.launch_router [flags]``).

Its flags are parsed as the router's argparse parser parses them, from ``engines/sglang_router.yaml``
(``SOURCES.md``): an unknown or ambiguous flag, a missing value, a value outside ``--policy``'s choices or a
non-number where it takes an int or float exit 2 with argparse's message in the log. With
``--service-discovery`` the router lists and watches pods: its pod's ServiceAccount must be allowed to ``list``
and ``watch`` pods in ``--service-discovery-namespace`` by a RoleBinding there (to a Role, or a ClusterRole),
else it logs the API server's 403 and exits 1. Listening on a loopback ``--host`` (the default) or
``--prometheus-host`` makes that server unreachable from the pod network, as for the real router.

Serving (:class:`Router`): the workers are the Running, Ready pods that match ``--selector`` (read at each
request, as a watch keeps them), each at ``--service-discovery-port``. ``/v1/chat/completions``,
``/v1/completions`` and ``/generate`` go to one worker by ``--policy`` and the worker's answer comes back as it
is (its ``x-sandbox-pod`` names the worker); ``/v1/models`` asks any worker; ``/liveness`` is 200,
``/readiness`` and ``/health`` are 200 once a worker is known (503 before). ``cache_aware`` keeps, per worker, the
request texts it routed (the approximate radix tree of the real policy): the worker holding the longest common
prefix wins when that prefix covers more than ``--cache-threshold`` of the text, otherwise the worker with the
smallest tree; when the load is imbalanced (the busiest worker's running requests exceed the idlest's by more than
``--balance-abs-threshold`` and by a factor above ``--balance-rel-threshold``) the idlest worker is chosen
instead. Each worker's tree is cut to ``--max-tree-size`` characters (oldest texts first) at each insert, where the real
router evicts every ``--eviction-interval-secs``. ``round_robin`` takes
the workers in turn (sorted by pod name), ``random`` any, ``power_of_two`` the less loaded of two. The
Prometheus page on ``--prometheus-port`` uses the router's metric names (``sgl_router_requests_total`` by route,
``sgl_router_processed_requests_total`` and ``sgl_router_policy_decisions_total`` by worker URL,
``sgl_router_cache_hits_total``, ``sgl_router_cache_misses_total``, ``sgl_router_active_workers``,
``sgl_router_running_requests``, ``sgl_router_tree_size``).
"""

from __future__ import annotations

import functools
import json
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import backends, proxy
from .errors import ApiError
from .processes import Process, program
from .resources import POD_KEY
from .selectors import label_selector_from_match, labels_match, parse_label_selector
from .store import Obj

FLAGS = Path(__file__).parent / "engines" / "sglang_router.yaml"
PROG = "launch_router.py"
RBAC = "rbac.authorization.k8s.io"
LOOPBACK = ("127.", "localhost", "::1")
ROUTED = ("/v1/chat/completions", "/v1/completions", "/generate")


@functools.cache
def spec() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(FLAGS.read_text())
    return loaded


class RouterError(Exception):
    def __init__(self, lines: list[str], exit_code: int) -> None:
        super().__init__(lines[-1])
        self.lines, self.exit_code = lines, exit_code


def router_argv(container: dict[str, Any]) -> list[str] | None:
    """The flags when the container runs ``python[3] -m sglang_router.launch_router``; else None."""
    argv = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1].startswith("python") and argv[1:3] == ["-m", spec()["module"]]:
        return argv[3:]
    return None


def _fail(message: str) -> RouterError:
    return RouterError([f"usage: {PROG} [-h] [--host HOST] [--port PORT] ...", f"{PROG}: error: {message}"], 2)


def _resolve(word: str, known: list[str]) -> str:
    """argparse's option lookup: an exact name, else an unambiguous prefix (allow_abbrev's default)."""
    if word in known:
        return word
    found = [k for k in known if k.startswith(word)]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise _fail(f"ambiguous option: {word} could match {', '.join(found)}")
    raise _fail(f"unrecognized arguments: {word}")


def parse(argv: list[str]) -> dict[str, Any]:
    """The parsed flags (defaults where absent), as the router's parser would take them."""
    data = spec()
    known = [*data["switch"], *data["value"], *data["values"]]
    args: dict[str, Any] = dict(data["defaults"])
    i = 0
    while i < len(argv):
        word, inline = argv[i], None
        if not word.startswith("--"):
            raise _fail(f"unrecognized arguments: {' '.join(argv[i:])}")
        if "=" in word:
            word, inline = word.split("=", 1)
        flag = _resolve(word, known)
        i += 1
        if flag in data["switch"]:
            args[flag] = True
            continue
        if flag in data["values"]:
            taken = [] if inline is None else [inline]
            while inline is None and i < len(argv) and not argv[i].startswith("--"):
                taken.append(argv[i])
                i += 1
            args[flag] = taken
            continue
        if inline is None:
            if i >= len(argv) or argv[i].startswith("--"):
                raise _fail(f"argument {flag}: expected one argument")
            inline, i = argv[i], i + 1
        args[flag] = _typed(flag, inline)
    return args


def _typed(flag: str, value: str) -> Any:
    data = spec()
    choices = (data.get("choices") or {}).get(flag)
    if choices and value not in choices:
        raise _fail(f"argument {flag}: invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})")
    for kind, cast in (("int", int), ("float", float)):
        if flag in data[kind]:
            try:
                return cast(value)
            except ValueError:
                raise _fail(f"argument {flag}: invalid {kind} value: {value!r}") from None
    return value


def may_watch_pods(proc: Process, namespace: str) -> bool:
    """Whether the pod's ServiceAccount may list and watch pods in ``namespace`` (RBAC: a RoleBinding there to a
    Role or ClusterRole whose rules grant both on core ``pods``)."""
    account = str((proc.pod_obj.get("spec") or {}).get("serviceAccountName") or "default")
    for _, binding in proc.cluster.store.items((RBAC, "rolebindings"), namespace):
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   and (s.get("namespace") or namespace) == proc.namespace for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role = proc.cluster.store.get((RBAC, "roles"), (namespace, str(ref.get("name")))) \
            if ref.get("kind") == "Role" else proc.cluster.store.get((RBAC, "clusterroles"), ("", str(ref.get("name"))))
        granted: set[str] = set()
        for rule in (role or {}).get("rules") or []:
            if {"", "*"} & set(rule.get("apiGroups") or []) and {"pods", "*"} & set(rule.get("resources") or []):
                granted |= set(rule.get("verbs") or [])
        if "*" in granted or {"list", "watch"} <= granted:
            return True
    return False


def _prompt(body: dict[str, Any]) -> str:
    if isinstance(body.get("messages"), list):
        return "".join(str(m.get("content") or "") for m in body["messages"] if isinstance(m, dict))
    text = body.get("prompt", body.get("text", ""))
    return "".join(map(str, text)) if isinstance(text, list) else str(text)


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Router:
    """One router's state: its policy and knobs, the prefix trees, the counters its metrics page shows."""

    cluster: Any
    namespace: str
    selector: dict[str, str]
    worker_port: int
    args: dict[str, Any]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    trees: dict[str, list[str]] = field(default_factory=dict)  # worker URL -> the texts routed to it, oldest first
    running: dict[str, int] = field(default_factory=dict)
    turn: int = 0
    requests: dict[str, int] = field(default_factory=dict)  # route -> count
    processed: dict[str, int] = field(default_factory=dict)  # worker URL -> count
    hits: int = 0
    misses: int = 0

    def workers(self) -> list[tuple[str, Obj]]:
        reqs = parse_label_selector(label_selector_from_match({"matchLabels": self.selector}))
        found = [(f"http://{(p.get('status') or {}).get('podIP')}:{self.worker_port}", p)
                 for _, p in self.cluster.store.items(POD_KEY, self.namespace)
                 if labels_match(reqs, p["metadata"].get("labels")) and proxy.ready_endpoint(p)
                 and (p.get("status") or {}).get("podIP")]
        return sorted(found, key=lambda w: str(w[1]["metadata"]["name"]))

    def __call__(self, request: backends.Request) -> backends.Response:
        path = request.path.rstrip("/") or "/"
        with self._lock:
            self.requests[path] = self.requests.get(path, 0) + 1
        workers = self.workers()
        if path == "/liveness":
            return backends.Response(200, b"OK", [("Content-Type", "text/plain")])
        if path in ("/readiness", "/health"):
            ready = bool(workers)
            return backends.Response(200 if ready else 503, b"OK" if ready else b"no healthy workers",
                                     [("Content-Type", "text/plain")])
        if not workers:
            return self._error(503, "No available workers")
        if path == "/v1/models":
            return self._send(workers[0], request)
        if path not in ROUTED or request.method != "POST":
            return self._error(404, f"Not found: {request.method} {path}")
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return self._error(400, "Invalid JSON body")
        text = _prompt(body if isinstance(body, dict) else {})
        with self._lock:
            chosen = self._choose(workers, text)
            self.running[chosen[0]] = self.running.get(chosen[0], 0) + 1
            self.processed[chosen[0]] = self.processed.get(chosen[0], 0) + 1
        try:
            return self._send(chosen, request)
        finally:
            with self._lock:
                self.running[chosen[0]] -= 1

    def _send(self, worker: tuple[str, Obj], request: backends.Request) -> backends.Response:
        try:
            return proxy.forward(self.cluster, proxy.Target(worker[1], self.worker_port), request)
        except ApiError as exc:  # the worker went away between discovery and the request
            return self._error(502, f"Failed to send request to worker {worker[0]}: {exc.message}")

    def _error(self, status: int, message: str) -> backends.Response:
        return backends.Response(status, json.dumps({"error": {"message": message, "code": status}}).encode(),
                                 [("Content-Type", "application/json")])

    def _choose(self, workers: list[tuple[str, Obj]], text: str) -> tuple[str, Obj]:
        policy = self.args["--policy"]
        if policy == "round_robin":
            self.turn += 1
            return workers[(self.turn - 1) % len(workers)]
        if policy == "random":
            return random.choice(workers)
        if policy == "power_of_two":
            pair = random.sample(workers, min(2, len(workers)))
            return min(pair, key=lambda w: self.running.get(w[0], 0))
        return self._cache_aware(workers, text)

    def _cache_aware(self, workers: list[tuple[str, Obj]], text: str) -> tuple[str, Obj]:
        loads = [self.running.get(url, 0) for url, _ in workers]
        most, least = max(loads), min(loads)
        if most - least > int(self.args["--balance-abs-threshold"]) \
                and most > least * float(self.args["--balance-rel-threshold"]):
            chosen = workers[loads.index(least)]
        else:
            matched = [max((_common(text, seen) for seen in self.trees.get(url, [])), default=0)
                       for url, _ in workers]
            best = max(range(len(workers)), key=lambda i: matched[i])
            if text and matched[best] / len(text) > float(self.args["--cache-threshold"]):
                chosen = workers[best]
                self.hits += 1
            else:
                chosen = min(workers, key=lambda w: sum(map(len, self.trees.get(w[0], []))))
                self.misses += 1
        tree = self.trees.setdefault(chosen[0], [])
        tree.append(text)
        while len(tree) > 1 and sum(map(len, tree)) > int(self.args["--max-tree-size"]):
            tree.pop(0)
        return chosen

    def metrics(self, request: backends.Request) -> backends.Response:
        with self._lock:
            lines = ["# TYPE sgl_router_requests_total counter"]
            lines += [f'sgl_router_requests_total{{route="{r}"}} {n}' for r, n in sorted(self.requests.items())]
            lines.append("# TYPE sgl_router_processed_requests_total counter")
            lines += [f'sgl_router_processed_requests_total{{worker="{w}"}} {n}'
                      for w, n in sorted(self.processed.items())]
            lines.append("# TYPE sgl_router_policy_decisions_total counter")
            lines += [f'sgl_router_policy_decisions_total{{policy="{self.args["--policy"]}",worker="{w}"}} {n}'
                      for w, n in sorted(self.processed.items())]
            lines += ["# TYPE sgl_router_cache_hits_total counter", f"sgl_router_cache_hits_total {self.hits}",
                      "# TYPE sgl_router_cache_misses_total counter", f"sgl_router_cache_misses_total {self.misses}",
                      "# TYPE sgl_router_active_workers gauge", f"sgl_router_active_workers {len(self.workers())}",
                      "# TYPE sgl_router_running_requests gauge"]
            lines += [f'sgl_router_running_requests{{worker="{w}"}} {n}' for w, n in sorted(self.running.items())]
            lines.append("# TYPE sgl_router_tree_size gauge")
            lines += [f'sgl_router_tree_size{{worker="{w}"}} {sum(map(len, t))}' for w, t in sorted(self.trees.items())]
        return backends.Response(200, ("\n".join(lines) + "\n").encode(),
                                 [("Content-Type", "text/plain; version=0.0.4")])


def _claims(pod: Obj, container: dict[str, Any]) -> bool:
    return router_argv(container) is not None


@program(_claims)
def route(proc: Process) -> int:
    argv = router_argv(proc.spec)
    assert argv is not None
    try:
        args = parse(argv)
        namespace = str(args.get("--service-discovery-namespace") or proc.namespace)
        selector = dict(item.split("=", 1) for item in args.get("--selector") or [] if "=" in item)
        if not args.get("--service-discovery") and not args.get("--worker-urls"):
            raise RouterError(["Error: no workers: give --worker-urls or --service-discovery with --selector"], 1)
        if args.get("--service-discovery") and not may_watch_pods(proc, namespace):
            account = (proc.pod_obj.get("spec") or {}).get("serviceAccountName") or "default"
            raise RouterError([f'Error: service discovery failed: pods is forbidden: User "system:serviceaccount:'
                               f'{proc.namespace}:{account}" cannot list resource "pods" in API group "" in the '
                               f'namespace "{namespace}"'], 1)
    except RouterError as exc:
        for line in exc.lines:
            proc.log(line)
        return exc.exit_code
    router = Router(proc.cluster, namespace, selector, int(args["--service-discovery-port"]), args)
    proc.log(f"Starting router on {args['--host']}:{args['--port']} | policy: {args['--policy']} | service "
             f"discovery: selector {selector} in namespace {namespace} (simulated by the InstantStart sandbox on pod "
             f"{proc.pod})")
    if not str(args["--host"]).startswith(LOOPBACK):
        proc.listen(int(args["--port"]), router)
    if not str(args["--prometheus-host"]).startswith(LOOPBACK):
        proc.listen(int(args["--prometheus-port"]), router.metrics)
        proc.log(f"Prometheus metrics on {args['--prometheus-host']}:{args['--prometheus-port']}")
    proc.sleep(float("inf"))  # serves until killed
    return 0
