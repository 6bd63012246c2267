"""Request and response models of the features noun, shared by REST, the pane and the MCP tools.

``PATCH /api/v1/clusters/{cluster}/features`` is an explicit diff: its body names only the features the client
changes, each ``true`` (on), ``false`` (off) or an object (on, with these settings; ``"adopt": true`` takes
over an installation someone else made). Its model is built from the feature list, so every feature is a
documented field and an unknown one is refused with the closest name.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, create_model

from services.features.registry import FEATURES, Feature
from services.models import RequestModel, ResponseModel

FEATURE_VALUE = ("true: turn on (with its current settings, or the defaults); false: turn off; an object: turn on "
                 "with these settings (only the fields given change) - add \"adopt\": true to take over an "
                 "installation this control plane did not make")


class FeatureView(ResponseModel):
    """One feature of one cluster, as it is now."""

    name: str = Field(..., description="the field to send in features_update")
    component: str = Field(..., description="the component it installs (an EKS add-on or Kubernetes manifests)")
    kind: str = Field(..., description="addon (EKS add-on API) or manifest (Kubernetes objects we apply)")
    summary: str
    enabled: bool = Field(..., description="installed on the cluster (by us or, when foreign, by someone else)")
    foreign: bool = Field(False, description="installed, but not by this control plane: used as it is, never "
                                             "changed or removed unless adopted ({\"adopt\": true})")
    status: str = Field(..., description="the component's own status word (EKS add-on status, Ready, ABSENT ...)")
    healthy: bool
    detail: str = ""
    version: str = ""
    settings: dict[str, Any] = Field(default_factory=dict, description="the actual settings (configurable "
                                                                       "features only)")
    settings_schema: dict[str, Any] | None = Field(None, description="JSON schema of the settings object; null: "
                                                                     "the feature has no settings")
    depends_on: list[str] = Field(default_factory=list, description="features turned on with it, first")
    required_by: list[str] = Field(default_factory=list, description="enabled features that need this one: it "
                                                                     "cannot be turned off while they are on")


class FeaturesView(ResponseModel):
    cluster: str
    features: list[FeatureView]


class FeatureChange(RequestModel):
    """What one stage of ``features.update`` does to one feature."""

    feature: str
    enabled: bool
    settings: dict[str, Any] | None = None
    adopt: bool = False
    requested: bool = Field(True, description="named in the request (false: a prerequisite turned on with it)")


class FeaturesPlan(RequestModel):
    """The ``features.update`` operation's request, computed by the precheck from the body and actual state."""

    cluster: str
    region: str
    account: str
    eks_cluster: str
    vpc_id: str = ""
    bucket: str | None = None
    hyperpod_arn: str | None = None
    hyperpod_cluster: str = ""  # its name ("" if none): the features that configure it
    changes: list[FeatureChange]
    stages: list[str]
    requested_by: str = ""


def _patch_model(features: tuple[Feature, ...]) -> type[RequestModel]:
    fields: dict[str, Any] = {
        f.name: (StrictBool | dict[str, Any] | None, Field(None, description=f"{f.summary}. {FEATURE_VALUE}"))
        for f in features}
    model: type[RequestModel] = create_model("FeaturesPatch", __base__=RequestModel, **fields)
    model.__doc__ = ("Only the features to change: true (on), false (off) or an object (on, with these "
                     "settings; \"adopt\": true to take over someone else's installation). Absent: untouched.")
    return model


FeaturesPatch = _patch_model(FEATURES)
