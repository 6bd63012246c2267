"""The ``features`` noun: the managed features of a registered cluster (``list_features``) and the explicit-diff
toggle (``update_features``) that turns them on, off or reconfigures them.

The precheck reads actual state, validates each touched feature's settings with its component's
``settings_model``, refuses (409) a change that would leave an enabled feature without what it depends on
(naming the dependent), refuses to change or remove what someone else installed unless the request adopts it,
then submits one ``features.update`` operation whose stages are the touched features and their prerequisites in
dependency order. Nothing here writes to AWS or Kubernetes: the stages do, and only where actual state differs
from the request, so re-sending the current state is an operation that changes nothing.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from services.auth import Principal, Role
from services.aws import AwsClients
from services.awscache import AwsCache
from services.clusters.create_base import cluster_tags
from services.clusters.pipeline import cluster_target
from services.clusters.registry import ClusterRegistry
from services.components import Observation, Target
from services.components.hyperpod_addons import ConfiguredAddon
from services.errors import Conflict, Forbidden, Invalid, Permanent
from services.features.models import FeatureChange, FeaturesPatch, FeaturesPlan, FeaturesView, FeatureView
from services.features.registry import FEATURES, Feature, by_name, dependents, prerequisites
from services.features.stages import REMOVE, configured, feature_stages
from services.kube import KubeClients
from services.operations import Engine, OperationView
from services.settings import Settings
from services.stages import OperationKind
from services.verbs import verb

KIND = "features.update"
__all__ = ["FEATURES", "KIND", "Feature", "Features", "FeaturesPatch", "features_target"]


@runtime_checkable
class Preflighted(Protocol):
    """A component with a side-effect-free check of whether it can be turned on with ``settings`` (its
    validated settings model, or None) on ``target``: each problem it returns is a reason to refuse (409)."""

    def preflight(self, target: Target, settings: BaseModel | None) -> list[str]: ...


def features_target(cluster: str) -> str:
    return f"{cluster_target(cluster)}/features"


def enabled(obs: Observation) -> bool:
    """Installed, by us or by someone else (a partly applied component of ours counts as off: on reconciles it)."""
    return obs.foreign or obs.status != "ABSENT"


class Features:
    """Verbs of the features noun; ``features`` is the list of toggles (the registry's, by default)."""

    def __init__(self, settings: Settings, aws: AwsClients, kube: KubeClients, registry: ClusterRegistry,
                 engine: Engine, cache: AwsCache, features: tuple[Feature, ...] = FEATURES) -> None:
        self.settings = settings
        self.cache = cache
        self.aws = aws
        self.kube = kube
        self.registry = registry
        self._engine = engine
        self.features = features
        self._index = by_name(features)

    def kinds(self) -> list[OperationKind[Any]]:
        return [OperationKind(KIND, FeaturesPlan, feature_stages(self.features, self.aws.for_stages(), self.kube),
                              target=lambda plan: features_target(plan.cluster), role=Role.OPERATOR,
                              plan=lambda plan: plan.stages,
                              description="turn a cluster's managed features on or off, or change their settings")]

    # ----- facts ---------------------------------------------------------------------------------------------

    def _plan_base(self, cluster: str, principal: Principal) -> FeaturesPlan:
        record = self.registry.get(cluster)
        account = record.eks_arn.split(":")[4]
        client = self.aws.client("eks", record.region)
        answer, _ = self.cache.get(("eks", "describe_cluster", record.region, record.eks_name),
                                   lambda: client.describe_cluster(name=record.eks_name))  # the clusters reader's entry
        eks = answer["cluster"]
        return FeaturesPlan(cluster=record.name, region=record.region, account=account, eks_cluster=record.eks_name,
                            vpc_id=(eks.get("resourcesVpcConfig") or {}).get("vpcId", ""),
                            bucket=self.settings.shared_bucket or f"instantstart-shared-{account}-{record.region}",
                            hyperpod_arn=record.hyperpod_arn, hyperpod_cluster=record.hyperpod_name or "",
                            changes=[], stages=[], requested_by=principal.name)

    def _target(self, plan: FeaturesPlan) -> Target:
        return Target(cluster=plan.cluster, eks_cluster=plan.eks_cluster, region=plan.region, account=plan.account,
                      tags=cluster_tags(plan.cluster), aws=self.aws, kube=self.kube.api_client(plan.cluster),
                      bucket=plan.bucket, vpc_id=plan.vpc_id, hyperpod_arn=plan.hyperpod_arn,
                      hyperpod_cluster=plan.hyperpod_cluster)

    def _observe(self, target: Target) -> dict[str, Observation]:
        return {f.name: f.component.observe(target) for f in self.features}

    # ----- reads ---------------------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def list_features(self, principal: Principal, cluster: str) -> FeaturesView:
        """Every feature of ``cluster`` as it is now: on or off, foreign or ours, status, actual settings."""
        observed = self._observe(self._target(self._plan_base(cluster, principal)))
        views = []
        for f in self.features:
            obs, model = observed[f.name], f.component.settings_model
            views.append(FeatureView(
                name=f.name, component=f.component.name, kind=f.component.kind, summary=f.summary,
                enabled=enabled(obs), foreign=obs.foreign, status=obs.status, healthy=obs.healthy, detail=obs.detail,
                version=obs.version, settings=obs.settings if enabled(obs) else {},
                settings_schema=model.model_json_schema() if model is not None else None,
                depends_on=list(f.depends_on),
                required_by=[d for d in dependents(self.features, f.name) if enabled(observed[d])]))
        return FeaturesView(cluster=cluster, features=views)

    # ----- mutation ------------------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def update_features(self, principal: Principal, cluster: str, request: BaseModel,
                        idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Precheck the explicit diff ``request`` against actual state, then submit ``features.update``."""
        touched: dict[str, Any] = request.model_dump(exclude_none=True)
        if not touched:
            raise Invalid("name at least one feature to change (true, false or a settings object); features: "
                          + ", ".join(self._index), details={"features": list(self._index)})
        off = sorted(name for name, value in touched.items() if value is False)
        if off and not principal.allows(Role.ADMIN):
            # turning off deletes add-ons, CRDs and the custom resources they hold (DESIGN §5): admins only
            message = (f"turning off {', '.join(off)} deletes what it installed and needs the admin role; token "
                       f"{principal.name!r} has {principal.role.value} (turning features on needs operator)")
            self._engine.audit.record(principal, KIND, features_target(cluster), touched, "denied", detail=message)
            raise Forbidden(message, details={"required_role": Role.ADMIN.value, "role": principal.role.value,
                                              "features": off})
        plan = self._plan_base(cluster, principal)
        target = self._target(plan)
        observed = self._observe(target)
        changes = {name: self._change(name, value, observed[name]) for name, value in touched.items()}
        wanted_on = {n for n, c in changes.items() if c.enabled}
        turned_off = {n for n, c in changes.items() if not c.enabled}
        for name in sorted(prerequisites(self.features, wanted_on) - wanted_on):
            if name in turned_off:
                needs = [n for n in wanted_on if name in prerequisites(self.features, [n])]
                raise Conflict(f"{name} cannot be turned off: {', '.join(sorted(needs))}, turned on in this request, "
                               "depends on it", details={"feature": name, "dependents": sorted(needs)})
            obs = observed[name]
            keep = obs.settings if self._index[name].component.settings_model is not None and enabled(obs) else None
            changes[name] = FeatureChange(feature=name, enabled=True, settings=keep or None, requested=False)
        on_after = ({n for n, o in observed.items() if enabled(o)} - turned_off) | {
            n for n, c in changes.items() if c.enabled}
        for name in sorted(on_after):
            # only what this request turns off: a prerequisite missing before it (a user's own install) is theirs
            broken = [d for d in self._index[name].depends_on if d in turned_off]
            if broken:
                raise Conflict(f"turning off {', '.join(broken)} would break {name}, which is on and depends on it: "
                               f"turn {name} off first, or in the same request (\"{name}\": false)",
                               details={"dependent": name, "depends_on": broken})
        for change in changes.values():
            self._check_config(change, target)
        for change in changes.values():
            self._preflight(change, target)
        for name in sorted(n for n in turned_off if enabled(observed[n])):
            self._check_unused(self._index[name], target)
        order = [f.name for f in self.features]
        stages = [REMOVE + n for n in reversed(order) if n in turned_off] + [n for n in order if n in changes
                                                                            and changes[n].enabled]
        plan = plan.model_copy(update={"changes": [changes[n] for n in order if n in changes], "stages": stages})
        return self._engine.submit(KIND, plan, principal, idempotency_key)

    def _change(self, name: str, value: bool | dict[str, Any], obs: Observation) -> FeatureChange:
        feature = self._index[name]
        model = feature.component.settings_model
        if value is False:
            if obs.foreign:
                raise Conflict(f"{name} was installed by someone else (no tag or label of this control plane): it is "
                               "never removed here; remove it where it was installed, or adopt it first "
                               f"({{\"{name}\": {{\"adopt\": true}}}})", details={"feature": name, "foreign": True})
            return FeatureChange(feature=name, enabled=False)
        current = obs.settings if model is not None and enabled(obs) else {}
        if value is True:
            return FeatureChange(feature=name, enabled=True,
                                 settings=self._settings(name, model, current, {}) if model is not None else None)
        given = dict(value)
        adopt = given.pop("adopt", False)
        if not isinstance(adopt, bool):
            raise Invalid(f"{name}.adopt must be true or false, not {adopt!r}")
        if given and model is None:
            raise Invalid(f"{name} has no settings: send true, false, or {{\"adopt\": true}}; got "
                          f"{', '.join(sorted(given))}", details={"feature": name, "fields": sorted(given)})
        if given and obs.foreign and not adopt:
            raise Conflict(f"{name} was installed by someone else: its settings are not changed here unless you adopt "
                           f"it ({{\"{name}\": {{\"adopt\": true, ...}}}})", details={"feature": name, "foreign": True})
        settings = self._settings(name, model, current, given) if model is not None else None
        return FeatureChange(feature=name, enabled=True, settings=settings, adopt=adopt and obs.foreign)

    @staticmethod
    def _settings(name: str, model: type[BaseModel], current: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
        """``given`` over the actual settings (the model's defaults for a feature that is off), validated."""
        try:
            return model.model_validate({**current, **given}).model_dump()
        except ValidationError as exc:
            raise Invalid(f"{name}: invalid settings: "
                          + "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()),
                          details={"feature": name, "fields": list(model.model_fields)}) from None

    def _preflight(self, change: FeatureChange, target: Target) -> None:
        """A component's own side-effect-free check of a feature this request turns on or reconfigures."""
        component = configured(self._index[change.feature], change)
        if not change.enabled or not isinstance(component, Preflighted):
            return
        model = component.settings_model
        settings = model.model_validate(change.settings) if model is not None and change.settings is not None else None
        problems = component.preflight(target, settings)
        if problems:
            raise Conflict(f"{change.feature} cannot be turned on: " + "; ".join(problems),
                           details={"feature": change.feature, "problems": problems})

    @staticmethod
    def _check_unused(feature: Feature, target: Target) -> None:
        """A feature is not turned off while objects still use it (bound volumes, its custom resources ...)."""
        if feature.in_use is None or target.kube is None:
            return
        using = feature.in_use(target.kube)
        if using:
            raise Conflict(f"{feature.name} cannot be turned off while {len(using)} object(s) use it: "
                           f"{', '.join(using[:10])}{' ...' if len(using) > 10 else ''}: {feature.in_use_hint}",
                           details={"feature": feature.name, "in_use": using})

    def _check_config(self, change: FeatureChange, target: Target) -> None:
        """A feature whose configuration needs facts the cluster lacks (a HyperPod cluster) is refused now."""
        component = configured(self._index[change.feature], change)
        if change.enabled and isinstance(component, ConfiguredAddon):
            try:
                component.wanted_values(target)
            except Permanent as exc:
                raise Conflict(f"{change.feature} cannot be turned on: {exc.message}",
                               details={"feature": change.feature}) from None
