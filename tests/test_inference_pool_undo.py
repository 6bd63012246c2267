"""An assign of model-pool pods that ends without success gives back exactly the pods it relabelled, found on the API by
its operation's mark, however it ends: a lost answer then a resume (and a retry that claims them all again), a cancel
during a retry's back-off, a give-back that cannot settle a pod (named, after the others; the assign's own error
kept), a pod the service got from someone else meanwhile, a give-back that meets a rival change (retried after its
paced delay) or keeps meeting them (named once), a claimed pod that starts terminating. Against a real server in
sandbox mode, on a pool of two pods; faults are injected through the Kubernetes client's transport."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.audit import AuditQuery
from services.auth import Principal, Role
from services.errors import NotFound, Permanent, Transient
from services.inference.pool_models import PoolAssign, PoolRelease
from services.inference.pool_stages import CLAIMED_BY, UNDO_TRIES
from tests.jobs_support import CLUSTER, JobWorld, job_world
from tests.ledger import CallLedger
from tests.support import wait_until
from tests.test_inference_pool import BASE, NS, POOL, finished, pod_patches, pods

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobWorld]:
    with job_world(tmp_path_factory.mktemp("pool-undo"), components=(), nodes=2) as made:
        assert finished(made, made.live.post(BASE, {**POOL, "replicas": 2}))["status"] == "succeeded"
        wait_until(lambda: len(ps := made.live.get(f"{BASE}/warm").json()["pods"]) == 2 and all(
            p["ready"] for p in ps), 60, "the pool's two pods Ready in the product's view")
        yield made


def test_an_assign_that_ends_without_success_gives_back_exactly_its_own_pods(
        world: JobWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Each pod an assign relabels carries its operation's id (written in the same patch as the label), so the
    give-back reads its own pods from the API: a pod relabelled just before the stage died (the patch applied, its
    answer lost) is found on the resume and given back when a later pod is lost; a cancel during a retry's
    back-off gives back what was claimed; a give-back that cannot settle a pod goes on, names it and keeps the
    assign's own error; a pod the service got meanwhile from someone else fails the assign (never a silent
    success with fewer pods) and is not taken back; a give-back that meets a rival change of a pod (409) reads it
    again after its paced delay and gives it back, one that keeps meeting them names the pod after UNDO_TRIES, once
    (the on_unsuccessful hook does not run the failed claim stage's give-back again); a claimed pod that starts
    terminating fails the assign and is skipped by the give-back (which still drops the Service), a release of it
    succeeds and an assign cannot pick it."""
    free = sorted(n for n, p in pods(world).items() if p.metadata.labels["business"] == "unassigned")
    first, second = free
    operator = Principal("undo-operator", Role.OPERATOR, "t-op", "api")
    ledger = CallLedger(world.live)
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        rest = services.kube.api_client(CLUSTER).rest_client
        real = rest.request
        faults: dict[tuple[str, str], Any] = {}

        changes = itertools.count()
        then = {"claim, then refuse": "refuse", "claim, then a rival": "rival once", "claim, then rivals": "rival"}

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            key = (method, pod := url.rsplit("/", 1)[-1])
            fault = faults.get(key)
            if fault in ("rival", "rival once") or (isinstance(fault, dict) and fault.get("before")):
                change = fault["before"] if isinstance(fault, dict) else {"annotations": {
                    "example.com/n": str(next(changes))}}  # a new value each time: the pod's resourceVersion moves
                world.core.patch_namespaced_pod(pod, NS, {"metadata": change})
            if fault == "rival once":
                faults.pop(key)
            if fault == "refuse":  # this patch never reaches the API server
                raise Permanent("the API server refused the patch")
            if isinstance(fault, str) and fault in then:  # this patch goes through, the next ones meet the fault
                faults[key] = then[fault]
            answer = real(method, url, *args, **kwargs)
            if fault == "then terminate":  # the claimed pod is evicted, held by a finalizer meanwhile
                faults.pop((method, url.rsplit("/", 1)[-1]))
                world.core.patch_namespaced_pod(first, NS, {"metadata": {"finalizers": ["example.com/hold"]}})
                world.core.delete_namespaced_pod(first, NS)
            if fault == "lost":  # applied, but the answer never came back: the stage could not remember it
                faults.pop((method, url.rsplit("/", 1)[-1]))
                raise Transient("the API server's answer was lost")
            return answer
        monkeypatch.setattr(rest, "request", request)

        def assign() -> Any:
            op, _ = services.pools.assign(operator, CLUSTER, "warm", PoolAssign(service="code", pods=[first, second]))
            return op

        def ended(op: Any) -> Any:
            return wait_until(lambda: (v := services.engine.run_until_idle(op.id)).status.terminal and v, 60,
                              "the assign to end")

        def layout() -> dict[str, tuple[str, str | None]]:
            return {n: (p.metadata.labels["business"], (p.metadata.annotations or {}).get(CLAIMED_BY))
                    for n, p in pods(world).items() if n in free}

        def unassign(pod: str) -> None:  # as another writer would, then seen by the product
            world.core.patch_namespaced_pod(pod, NS, {"metadata": {"labels": {"business": "unassigned"}}})
            wait_until(lambda: next(p for p in world.live.get(f"{BASE}/warm").json()["pods"] if p["name"] == pod)[
                "assigned_to"] is None, 30, f"the product to see {pod} unassigned")

        def has_code_service() -> bool:
            return "code" in {s.metadata.name for s in world.core.list_namespaced_service(NS).items}

        # the first pod's relabel applied but unremembered, then a rival takes the second one
        faults[("PATCH", first)] = "lost"
        faults[("PATCH", second)] = {"before": {"labels": {"business": "other"}}}
        lost = ended(assign())
        assert lost.status == "failed" and lost.error is not None, lost
        assert f"{second} is held by the service other now" in lost.error["message"], lost.error
        assert f"{first} went back to the pool" in lost.error["message"], lost.error
        assert layout() == {first: ("unassigned", None), second: ("other", None)}
        assert not has_code_service()
        faults.clear()
        unassign(second)  # a retry of the failed assign claims both again (the given-back pod too)
        services.engine.retry(lost.id, operator)
        assert (again := ended(lost)).status == "succeeded", again.error
        assert layout() == {first: ("code", lost.id), second: ("code", lost.id)}
        wait_until(lambda: len(next(s.pods for s in services.pools.describe_pool(operator, CLUSTER, "warm").services
                                    if s.name == "code")) == 2, 30, "the product to see code's two pods")
        released, _ = services.pools.release(operator, CLUSTER, "warm", PoolRelease(service="code"))
        assert services.engine.run_until_idle(released.id).status == "succeeded" and not has_code_service()

        # a cancel while the second pod's retry waits on its back-off (a writer changes it before every patch)
        faults[("PATCH", second)] = "rival"
        unassign(second)
        waiting = assign()
        wait_until(lambda: services.engine.run_until_idle(waiting.id).status == "waiting"
                   and layout()[first][0] == "code", 60, "the assign to wait on the second pod's back-off")
        assert services.engine.cancel(waiting.id, operator).status == "cancelled"
        assert layout() == {first: ("unassigned", None), second: ("unassigned", None)}
        assert not has_code_service()

        # the give-back of the first pod fails: the assign's own error stays, the pod is named as left claimed
        faults[("PATCH", second)] = {"before": {"labels": {"business": "other"}}}
        faults[("PATCH", first)] = "claim, then refuse"
        stuck_op = assign()
        stuck = ended(stuck_op)
        faults.clear()
        assert stuck.status == "failed" and stuck.error is not None, stuck
        message = stuck.error["message"]
        assert f"{second} is held by the service other now" in message and "the API server refused" in message
        assert f"{first} could not be given back and may still serve code" in message, message
        assert layout() == {first: ("code", stuck_op.id), second: ("other", None)}
        assert has_code_service()  # it still serves the pod left claimed
        wait_until(lambda: any(p["assigned_to"] == "code" for p in world.live.get(f"{BASE}/warm").json()["pods"]),
                   30, "the product to see the pod left claimed")
        released, _ = services.pools.release(operator, CLUSTER, "warm", PoolRelease(service="code"))
        assert services.engine.run_until_idle(released.id).status == "succeeded"
        assert layout()[first] == ("unassigned", None) and not has_code_service()

        # the second pod is given to the same service by someone else meanwhile: the assign fails naming it
        unassign(second)
        faults[("PATCH", second)] = {"before": {"labels": {"business": "code"}}}
        taken = ended(assign())
        faults.clear()
        assert taken.status == "failed" and taken.error is not None, taken
        assert f"{second} already serves code: it was taken meanwhile" in taken.error["message"], taken.error
        assert layout() == {first: ("unassigned", None), second: ("code", None)}
        assert has_code_service()  # the pod it did not take still has its Service
        unassign(second)
        world.core.delete_namespaced_service("code", NS)

        # the give-back meets a rival change of the first pod (409 on its resourceVersion): it reads the pod again
        # after its delay (scaled by the engine's pace) and gives it back
        faults[("PATCH", second)] = {"before": {"labels": {"business": "other"}}}
        faults[("PATCH", first)] = "claim, then a rival"
        mark = ledger.mark()
        retried = ended(assign())
        faults.clear()
        assert retried.status == "failed" and retried.error is not None, retried
        assert f"{first} went back to the pool" in retried.error["message"], retried.error
        assert (retried.error["details"]["given_back"], retried.error["details"]["stuck"]) == ([first], [])
        assert pod_patches(ledger, mark, first) == [200, 200, 409, 200]  # claim, rival, stale give-back, its retry
        assert layout() == {first: ("unassigned", None), second: ("other", None)}
        assert not has_code_service()
        unassign(second)

        # a pod that keeps changing under the give-back is tried UNDO_TRIES times, then named in the assign's error,
        # once: the on_unsuccessful hook does not give back again what the failed claim stage gave back (no second
        # round of patches, no warning in the server log); cancelling the failed assign runs the give-back again
        faults[("PATCH", second)] = {"before": {"labels": {"business": "other"}}}
        faults[("PATCH", first)] = "claim, then rivals"
        mark = ledger.mark()
        caplog.clear()
        changing = ended(assign())
        assert changing.status == "failed" and changing.error is not None, changing
        message = changing.error["message"]
        assert message.count(f"{first} could not be given back") == 1 and f"({first} kept changing)" in message, \
            message
        assert pod_patches(ledger, mark, first) == [200] + [200, 409] * UNDO_TRIES
        assert not [r for r in caplog.records if "undoing what the failed operation did" in r.getMessage()]
        failed = [e for e in services.audit.list(AuditQuery(operation_id=changing.id)) if e.outcome == "failed"]
        assert len(failed) == 1 and failed[0].detail.count(f"{first} could not be given back") == 1, failed
        assert layout() == {first: ("code", changing.id), second: ("other", None)}
        faults.clear()
        mark = ledger.mark()
        assert services.engine.cancel(changing.id, operator).status == "cancelled"
        assert pod_patches(ledger, mark, first) == [200]
        assert layout() == {first: ("unassigned", None), second: ("other", None)}
        assert not has_code_service()
        unassign(second)

        # a claimed pod starts terminating while a later pod's claim is retried: the assign fails naming it, its
        # give-back skips it (it holds nothing any more) and still drops the Service; a release of it succeeds
        faults[("PATCH", second)] = {"before": {"labels": {"business": "other"}}}
        faults[("PATCH", first)] = "then terminate"
        going = ended(assign())
        faults.clear()
        assert going.status == "failed" and going.error is not None, going
        assert going.error["message"].startswith(f"{first} is not a live pod of the pool warm"), going.error
        assert "could not be given back" not in going.error["message"], going.error
        assert not has_code_service()
        wait_until(lambda: any(p["name"] == first and p["assigned_to"] == "code" for p in world.live.get(
            f"{BASE}/warm").json()["pods"]), 30, "the product to see the terminating pod held")
        released, _ = services.pools.release(operator, CLUSTER, "warm", PoolRelease(service="code", pods=[first]))
        assert services.engine.run_until_idle(released.id).status == "succeeded"
        with pytest.raises(NotFound, match=f"{first} is not a pod of the pool"):  # terminating: never assigned
            services.pools.assign(operator, CLUSTER, "warm", PoolAssign(service="code", pods=[first]))
        world.core.patch_namespaced_pod(first, NS, {"metadata": {"finalizers": None}})
        unassign(second)
