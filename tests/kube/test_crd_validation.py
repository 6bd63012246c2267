"""Validation against the real CRDs bundled in sandbox/kube/crds, with upstream sample manifests copied to
``tests/data/examples`` (sources in its SOURCES.md) as positive and negative fixtures.

One difference from the README's offline check: the API server applies schema defaults *before* it
validates, so ``v1_deepseek_model15b.yaml``'s missing ``model.acceptEula`` (which has ``default: false``)
is not an error here, exactly as on a real cluster; its unknown ``server.*AutoScaleReplicas`` fields are.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.kube import COMPONENTS, ApiError, Cluster, WriteOptions, install_component_crds, load_component_crds
from sandbox.kube.components import CRD_DIR

from .conftest import Kubectl, KubeServer

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"


def _example(relative: str) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / relative).read_text())
    assert isinstance(doc, dict)
    return doc


def _source_rows(folder: Path) -> dict[str, tuple[int, str]]:
    """``file -> (bytes, sha256 prefix)`` from the copied-files table of ``folder/SOURCES.md``."""
    rows: dict[str, tuple[int, str]] = {}
    for line in (folder / "SOURCES.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and re.fullmatch(r"`[^`]+`", cells[0]) and cells[7].isdigit():
            rows[cells[0].strip("`")] = (int(cells[7]), cells[8].rstrip("…"))
    return rows


@pytest.mark.parametrize("folder", [EXAMPLES, CRD_DIR], ids=["examples", "crds"])
def test_every_copied_file_matches_its_source_row(folder: Path) -> None:
    rows = _source_rows(folder)
    files = {str(p.relative_to(folder)) for p in folder.rglob("*.yaml") if "RECONSTRUCTED" not in p.name}
    assert files and set(rows) == files
    for name, (size, sha_prefix) in rows.items():
        data = (folder / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()[:len(sha_prefix)]) == (size, sha_prefix), name


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    c = Cluster("validation")
    c.bootstrap()
    for component in COMPONENTS:
        install_component_crds(c, component)
    return c


def _create(c: Cluster, doc: dict[str, Any]) -> dict[str, Any]:
    rt = c.find_kind(doc["apiVersion"], doc["kind"])
    assert rt is not None, f"no CRD serves {doc['apiVersion']} {doc['kind']}"
    ns = doc["metadata"].get("namespace", "default")
    if c.store.get(("", "namespaces"), ("", ns)) is None:
        c.create(c.lookup("", "v1", "namespaces"), None, {"metadata": {"name": ns}})
    return c.create(rt, ns, doc, WriteOptions(validation="Strict", dry_run=True)).obj


def _causes(c: Cluster, doc: dict[str, Any]) -> set[str]:
    with pytest.raises(ApiError) as exc:
        _create(c, doc)
    assert exc.value.code == 422 and exc.value.reason == "Invalid"
    return {cause["field"] for cause in exc.value.details["causes"]}


def test_every_component_crd_installs_and_serves_its_kinds(cluster: Cluster) -> None:
    for component in COMPONENTS:
        for crd in load_component_crds(component):
            spec = crd["spec"]
            for version in spec["versions"]:
                if version.get("served", True):
                    rt = cluster.lookup(spec["group"], version["name"], spec["names"]["plural"])
                    assert rt.kind == spec["names"]["kind"]
                    assert rt.status == ("status" in (version.get("subresources") or {}))


@pytest.mark.parametrize("relative", [
    "hyperpod-inference-operator/v1_s3_deepseek15b.yaml",
    "hyperpod-inference-operator/v1_s3_modeldeployment.yaml",
    "hyperpodpytorchjob/pretrain_llama3_70b_checkpointless_p5.yaml",
])
def test_valid_samples_are_accepted(cluster: Cluster, relative: str) -> None:
    obj = _create(cluster, _example(relative))
    assert obj["metadata"]["name"]


@pytest.mark.parametrize("relative", [
    "hyperpod-inference-operator/v1_llama31_8b_intelligent_routing.yaml",
    "hyperpod-inference-operator/v1_llama31_8b_kv_cache_l1_l2.yaml",
])
def test_placeholder_tls_uri_is_rejected(cluster: Cluster, relative: str) -> None:
    assert _causes(cluster, _example(relative)) == {"spec.tlsConfig.tlsCertificateOutputS3Uri"}


def test_placeholders_become_valid_when_substituted(cluster: Cluster) -> None:
    doc = _example("hyperpod-inference-operator/v1_llama31_8b_kv_cache_l1_l2.yaml")
    doc["spec"]["tlsConfig"]["tlsCertificateOutputS3Uri"] = "s3://bucket/certs"
    assert _create(cluster, doc)["kind"] == "InferenceEndpointConfig"


def test_stale_jumpstart_sample_is_rejected_with_field_paths(cluster: Cluster) -> None:
    causes = _causes(cluster, _example("hyperpod-inference-operator/v1_deepseek_model15b.yaml"))
    assert causes == {"spec.server.maxAutoScaleReplicas", "spec.server.minAutoScaleReplicas"}


def test_model_deployment_kind_has_no_crd(cluster: Cluster) -> None:
    doc = _example("hyperpod-inference-operator/v1_modeldeployment.yaml")
    assert cluster.find_kind(doc["apiVersion"], doc["kind"]) is None


@pytest.mark.parametrize("relative", [
    "hyperpodpytorchjob/hpto_1b.yaml", "hyperpodpytorchjob/llama3_1_8b-fsdp-hpto.yaml"])
def test_unsubstituted_variables_in_integer_fields_are_rejected(cluster: Cluster, relative: str) -> None:
    doc = _example(relative)
    assert _causes(cluster, doc) == {"spec.replicaSpecs[0].replicas"}
    doc["spec"]["replicaSpecs"][0]["replicas"] = 2
    assert _create(cluster, doc)["spec"]["replicaSpecs"][0]["replicas"] == 2


def test_kubectl_reports_the_field_paths(kubectl: Kubectl, kube_server: KubeServer, cluster_name: str,
                                         tmp_path: Path) -> None:
    install_component_crds(kube_server.emulator.cluster(cluster_name), "inference-operator")
    kubectl("create", "namespace", "ns-team-a")
    manifest = tmp_path / "stale.yaml"
    manifest.write_text((EXAMPLES / "hyperpod-inference-operator/v1_deepseek_model15b.yaml").read_text())
    proc = kubectl("apply", "-f", str(manifest), check=False)
    assert proc.returncode == 1
    assert "spec.server.maxAutoScaleReplicas" in proc.stderr and "spec.server.minAutoScaleReplicas" in proc.stderr
    good = tmp_path / "good.yaml"
    good.write_text((EXAMPLES / "hyperpod-inference-operator/v1_s3_deepseek15b.yaml").read_text())
    ns = yaml.safe_load(good.read_text())["metadata"].get("namespace")
    if ns and ns != "ns-team-a":
        kubectl("create", "namespace", ns)
    assert "created" in kubectl("apply", "-f", str(good)).stdout
