"""Units of model downloads: the manifest the product submits (no token value in it, the claim at /s3, the
real CLI's flags), the progress read from the CLI's lines, and the simulated CLI's argv check."""

from __future__ import annotations

import json

import pytest

from sandbox.kube.downloader import HF_DOWNLOAD_OPTIONS, download_argv, parse_download_args
from services.secrets import SecretRef
from services.training.downloads.manifest import folder, job_manifest, model_label, new_id
from services.training.downloads.models import DownloadPlan, DownloadRequest
from services.training.downloads.progress import parse, size


def plan(**extra: object) -> DownloadPlan:
    base: dict[str, object] = {"cluster": "c1", "id": "hf-org-name-abcde", "model": "Org/Name-7B",
                               "namespace": "hyperpod-ns-training", "bucket": "b",
                               "key_prefix": "p/models/Org--Name-7B/", "requested_by": "me"}
    return DownloadPlan.model_validate({**base, **extra})


def test_the_job_passes_the_token_by_reference_only_and_uses_flags_the_cli_has() -> None:
    ref = SecretRef(cluster="c1", namespace="hyperpod-ns-training", name="hf-org-name-abcde-hf-token", key="token")
    job = job_manifest(plan(token=ref.model_dump(), revision="v1.0", include=["*.json"], exclude=["*.bin"]))
    spec = job["spec"]["template"]["spec"]
    init = spec["initContainers"][0]
    env = {e["name"]: e for e in init["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "hf-org-name-abcde-hf-token", "key": "token"}}}
    assert all("value" not in e or not str(e["value"]).startswith("hf_") for e in init["env"])
    argv = init["command"]
    assert argv[:5] == ["uvx", "--from", "huggingface_hub==2.4.0", "hf", "download"]
    assert [a for a in argv if a.startswith("-")] == ["--from", "--local-dir", "--revision", "--include", "--exclude"]
    assert all(a in HF_DOWNLOAD_OPTIONS for a in argv[5:] if a.startswith("-"))
    assert download_argv({"spec": spec}) == argv[5:]
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "instantstart"
        assert meta["labels"]["instantstart.io/download"] == "hf-org-name-abcde"
    publish = spec["containers"][0]
    assert publish["command"][-1] == "/s3/models/Org--Name-7B"
    assert {"name": "shared-s3", "mountPath": "/s3"} in publish["volumeMounts"]
    assert {"name": "shared-s3", "persistentVolumeClaim": {"claimName": "shared-s3"}} in spec["volumes"]
    assert job["spec"]["backoffLimit"] == 2 and spec["restartPolicy"] == "Never"
    without = job_manifest(plan())["spec"]["template"]["spec"]["initContainers"][0]
    assert "HF_TOKEN" not in {e["name"] for e in without["env"]}


def test_names_fit_kubernetes() -> None:
    long = "an-organisation-with-a-long-name/" + "m" * 90
    assert len(model_label(long)) <= 63 and model_label(long)[-1].isalnum()
    made = new_id(long)
    assert len(made) <= 63 and made == made.lower() and made.startswith("hf-")
    assert new_id("Qwen/Qwen2.5-0.5B") != new_id("Qwen/Qwen2.5-0.5B")
    assert folder("Qwen/Qwen2.5-0.5B") == "Qwen--Qwen2.5-0.5B"


def test_requests_refuse_what_would_not_be_a_model_or_a_glob() -> None:
    for bad in ({"model": "no-slash"}, {"model": "a/b/c"}, {"model": "a/b", "include": ["*.json; rm -rf /"]},
                {"model": "a/b", "namespace": "Not_A_Namespace"}):
        with pytest.raises(ValueError):
            DownloadRequest.model_validate(bad)
    assert "**********" in repr(DownloadRequest(model="a/b", hf_token="hf_secret"))  # type: ignore[arg-type]


def test_progress_reads_the_clis_lines() -> None:
    lines = ["Fetching 3 files:   0%|          | 0/3 [00:00<?, ?it/s]",
             "config.json: 100%|██████████| 1.02k/1.02k [00:00<00:00, 2.10MB/s]",
             "Fetching 3 files:  33%|███       | 1/3 [00:01<00:02, 1.00it/s]",
             "model-00001-of-00002.safetensors:  40%|████      | 1.99G/4.97G [00:10<00:15, 199MB/s]"]
    progress = parse(lines, ["'/scratch/model/./config.json' -> '/s3/models/a--b/./config.json'"])
    assert (progress.files_done, progress.files_total, progress.copied) == (1, 3, 1)
    assert progress.bytes_done == 1020 + 1_990_000_000
    assert progress.current_file == "model-00001-of-00002.safetensors"
    assert size("4.97G") == 4_970_000_000 and size("512") == 512


def test_the_simulated_cli_refuses_what_the_real_one_refuses() -> None:
    with pytest.raises(ValueError, match="No such option: --locl-dir"):
        parse_download_args(["a/b", "--locl-dir", "/x"])
    with pytest.raises(ValueError, match="requires an argument"):
        parse_download_args(["a/b", "--revision"])
    with pytest.raises(ValueError, match="Missing argument 'REPO_ID'"):
        parse_download_args(["--local-dir", "/x"])
    options, positional = parse_download_args(["a/b", "config.json", "--include=*.json", "--include", "*.txt",
                                               "--force-download"])
    assert positional == ["a/b", "config.json"] and options["--include"] == ["*.json", "*.txt"]
    assert json.dumps(options)
