"""REST routes of the features noun: each handler is one call of a verb in ``services/features``."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route, accepted
from app.api.clusters import CLUSTER
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.features import Features, FeaturesPatch
from services.features.models import FeaturesView
from services.replies import Accepted
from services.verbs import role_of


def _list(call: Call) -> Reply:
    return Reply(call.services.features.list_features(call.principal, call.path["cluster"]))


def _update(call: Call) -> Reply:
    view, created = call.services.features.update_features(call.principal, call.path["cluster"], call.body,
                                                           call.idempotency_key)
    return accepted(view, created)


ROUTES: list[Route] = [
    Route("GET", "/api/v1/clusters/{cluster}/features", "features_get", "A cluster's managed features",
          role_of(Features.list_features), _list, response=FeaturesView, path_params=CLUSTER, tag="features",
          open_world=True,
          description="Read-only: every managed feature of the cluster (cert-manager, the CSI drivers, KubeRay, "
                      "the load balancer controller, the HyperPod training and inference operators ...) as it is "
                      "now: enabled, foreign (installed by someone else: shown, never changed unless adopted), "
                      "status, health, actual settings and their JSON schema, what each depends on and which "
                      "enabled features need it."),
    Route("PATCH", "/api/v1/clusters/{cluster}/features", "features_update",
          "Turn managed features on or off, or change their settings", role_of(Features.update_features), _update,
          body=FeaturesPatch, response=Accepted, path_params=CLUSTER, read_only=False, destructive=True, status=202,
          tag="features",
          open_world=True,
          description="An explicit diff: send only the features to change, each true (on), false (off) or an "
                      "object (on with these settings; only the fields given change; \"adopt\": true takes over an "
                      "installation someone else made). Prerequisites are turned on first; removals go dependents "
                      "first. Refused at once (409, nothing changed) when turning one off would break an enabled "
                      "feature that depends on it (the message names it), or when it would change or remove a "
                      "foreign installation without adopt. Re-sending the current state runs an operation that "
                      "changes nothing. false deletes what the feature made (its add-on or objects, its IAM "
                      "role): confirm with the user first. Follow the operation with operations_wait; each "
                      "stage is one feature."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.features import FeaturesPane

    return FeaturesPane(features=services.features, clusters=services.clusters, operations=services.operations,
                        bus=services.bus, principal=principal, current_principal=current_principal(services, principal))


PAGES: list[Page] = [Page("features", "Advanced features", role_of(Features.list_features), _page)]
