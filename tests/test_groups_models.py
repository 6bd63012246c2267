"""The ``instance_groups`` request models against botocore's own model of what UpdateCluster accepts: group
names, deep health checks, Kubernetes labels and taints (counts, key and value patterns and lengths), so a bad
choice is a 422 before any operation instead of an AWS ValidationException in a stage."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest
from pydantic import ValidationError

from services.groups.models import GroupAdd, GroupPatch

MODEL = botocore.session.get_session().get_service_model("sagemaker")


def add(**fields: Any) -> GroupAdd:
    return GroupAdd.model_validate({"name": "workers", "count": 1, **fields})


def test_group_names_are_1_to_63_characters() -> None:
    assert add(name="a" * 63).name == "a" * 63
    for bad in ("a" + "-" * 62 + "b", "a" * 64, ""):
        with pytest.raises(ValidationError):
            add(name=bad)


def test_every_deep_health_check_of_the_api_is_accepted() -> None:
    enum = list(MODEL.shape_for("DeepHealthCheckType").enum)
    assert "MultiNodeTrainingValidation" in enum
    assert add(deep_health_checks=enum).deep_health_checks == enum
    with pytest.raises(ValidationError):
        add(deep_health_checks=["Nope"])


def test_labels_and_taints_follow_the_api_limits() -> None:
    assert MODEL.shape_for("ClusterKubernetesLabels").metadata["max"] == 50
    assert MODEL.shape_for("ClusterKubernetesTaints").metadata["max"] == 50
    fifty = {f"k{i}": "v" for i in range(50)}
    assert add(labels=fifty).labels == fifty
    assert add(labels={"example.com/team": "a.b-c_d"}).labels == {"example.com/team": "a.b-c_d"}
    taint = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}
    assert len(add(taints=[taint] * 50).taints) == 50
    bad_labels: list[dict[str, str]] = [{**fifty, "k50": "v"}, {"team": ""}, {"team": "-a"}, {"Bad_/x": "v"},
                                        {"-key": "v"}, {"k": "v" * 64}]
    for labels in bad_labels:
        with pytest.raises(ValidationError):
            add(labels=labels)
        with pytest.raises(ValidationError):
            GroupPatch.model_validate({"labels": labels})
    for taints in ([taint] * 51, [{**taint, "value": ""}], [{**taint, "key": "a b"}], [{**taint, "value": "x."}]):
        with pytest.raises(ValidationError):
            add(taints=taints)
        with pytest.raises(ValidationError):
            GroupPatch.model_validate({"taints": taints})
