"""The simulated Hugging Face download a sandbox kubelet runs for a model-download pod.

A real download pod runs ``hf download`` (huggingface_hub's CLI, usually through ``uvx --from
huggingface_hub==V``) in its init container into a scratch ``emptyDir``, then its main container copies the
files onto the shared bucket's Mountpoint volume (Mountpoint for S3 writes new files sequentially but
cannot rename, which ``hf download`` does for every file). Here, once such a pod runs:

* the CLI's argv is checked against the options of ``hf download``: an unknown option fails the init
  container (exit 2) with click's usage error, as the real CLI does;
* a gated model (:data:`GATED_ORGS`) without an ``HF_TOKEN`` fails like the Hub answers: ``401`` and
  ``GatedRepoError`` in the log (exit 1);
* otherwise it logs realistic progress (``Fetching N files``, one tqdm line per file with its bytes) over a
  few simulated seconds, then the copy container logs each file and the files land as S3 objects in the
  sandbox's own S3, at the volume's bucket and ``prefix`` mount option + the path under the mount, i.e.
  where Mountpoint would have written them; the pod then ends ``Succeeded`` (or ``Failed``).

The token is only checked for presence: it is never written anywhere. Nothing here persists: a download that
was running when the sandbox stopped starts again when its pod is seen running after the restart.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import posixpath
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import ApiError
from .resources import POD_KEY
from .store import Loc, Obj

if TYPE_CHECKING:
    from .cluster import Cluster

log = logging.getLogger(__name__)

ObjectStore = Callable[[str, str, bytes], None]  # (bucket, key, body): an S3 PutObject
HUB = "https://huggingface.co"
#: organisations whose models the simulated Hub treats as gated (accepting their licence needs a token)
GATED_ORGS = ("meta-llama", "mistralai", "google")
#: the options of ``hf download`` (huggingface_hub's typer CLI) and whether each takes a value
HF_DOWNLOAD_OPTIONS: dict[str, bool] = {
    "--type": True, "--repo-type": True, "--revision": True, "--include": True, "--exclude": True,
    "--cache-dir": True, "--local-dir": True, "--token": True, "--max-workers": True,
    "--force-download": False, "--no-force-download": False, "--dry-run": False, "--no-dry-run": False,
    "--help": False, "-h": False,
}
USAGE = "Usage: hf download [OPTIONS] REPO_ID [FILENAMES]..."
SECONDS_PER_FILE = 1.0  # simulated seconds each file takes to fetch
STEP = 0.01  # real seconds between looks at the simulated clock


class Downloads:
    """The simulated downloads of one cluster: which pods run one (at most one thread per pod)."""

    def __init__(self) -> None:
        self.object_store: ObjectStore | None = None
        self._lock = threading.Lock()
        self._running: set[str] = set()  # pod uids

    def simulates(self, cluster: Cluster, loc: Loc, pod: Obj) -> bool:
        """Whether ``pod`` (running) is a download this module simulates; starts its run once."""
        argv = download_argv(pod)
        if argv is None:
            return False
        uid = str(pod["metadata"]["uid"])
        with self._lock:
            if uid in self._running:
                return True
            self._running.add(uid)
        threading.Thread(target=self._run, args=(cluster, loc, uid, argv), name=f"hf-download-{loc[1]}",
                         daemon=True).start()
        return True

    def _run(self, cluster: Cluster, loc: Loc, uid: str, argv: list[str]) -> None:
        try:
            _Run(cluster, loc, uid, argv, self.object_store).run()
        except Exception:  # a bug here must not leave the pod running forever unnoticed
            log.exception("simulated download of pod %s/%s failed", *loc)
        finally:
            with self._lock:
                self._running.discard(uid)


def download_argv(pod: Obj) -> list[str] | None:
    """The ``hf download`` arguments of the pod's first init container (after ``download``), if it runs one."""
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
        if argv[:1] == ["uvx"]:  # uvx [--from SPEC] hf ...
            argv = argv[1:]
            while argv and argv[0].startswith("--"):
                argv = argv[2:] if argv[0] == "--from" else argv[1:]
        if len(argv) >= 2 and posixpath.basename(argv[0]) == "hf" and argv[1] == "download":
            return argv[2:]
    return None


def parse_download_args(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """``hf download``'s options (every value, in order) and positional arguments; ``ValueError`` with
    click's message for an unknown option or a missing value."""
    options: dict[str, list[str]] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if name not in HF_DOWNLOAD_OPTIONS:
                close = [o for o in HF_DOWNLOAD_OPTIONS if o.startswith(name[:4]) and len(o) > 2]
                hint = f" (Possible options: {', '.join(close)})" if close else ""
                raise ValueError(f"No such option: {name}{hint}")
            if HF_DOWNLOAD_OPTIONS[name]:
                if not eq:
                    i += 1
                    if i >= len(argv):
                        raise ValueError(f"Option '{name}' requires an argument.")
                    value = argv[i]
                options.setdefault(name, []).append(value)
            else:
                options.setdefault(name, []).append("")
        else:
            positional.append(arg)
        i += 1
    if not positional:
        raise ValueError("Missing argument 'REPO_ID'.")
    return options, positional


def model_files(repo: str) -> dict[str, bytes]:
    """A handful of realistic, small files of a model repository (deterministic per repository)."""
    seed = hashlib.sha256(repo.encode()).hexdigest()
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 16,
              "num_attention_heads": 32, "vocab_size": 128256, "torch_dtype": "bfloat16",
              "_name_or_path": repo}
    shard = b"\x00" * 2048
    return {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "README.md": f"---\nlicense: other\n---\n# {repo}\n".encode(),
        "config.json": json.dumps(config, indent=2).encode(),
        "generation_config.json": json.dumps({"bos_token_id": 128000, "eos_token_id": 128001}).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "seed": seed[:16]}}).encode(),
        "tokenizer_config.json": json.dumps({"model_max_length": 131072}).encode(),
        "model-00001-of-00002.safetensors": seed.encode() + shard,
        "model-00002-of-00002.safetensors": seed[::-1].encode() + shard[:1024],
        "model.safetensors.index.json": json.dumps({"metadata": {"total_size": 3200}, "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors"}}).encode(),
    }


def _human(size: float) -> str:
    """tqdm's ``unit_scale`` rendering of a byte count: ``512``, ``2.05k``, ``4.97G``."""
    for unit in ("", "k", "M", "G", "T"):
        if abs(size) < 999.5 or unit == "T":
            return f"{size:.0f}" if unit == "" else f"{size:.3g}{unit}"
        size /= 1000.0
    return f"{size:.3g}T"


def _bar(done: int, total: int) -> str:
    filled = int(10 * done / total) if total else 10
    return "█" * filled + " " * (10 - filled)


class _Run:
    """One pod's simulated ``hf download`` + copy."""

    def __init__(self, cluster: Cluster, loc: Loc, uid: str, argv: list[str], store: ObjectStore | None) -> None:
        self.cluster = cluster
        self.loc = loc
        self.uid = uid
        self.argv = argv
        self.store = store
        pod = self._pod()
        spec = (pod or {}).get("spec") or {}
        self.init = dict((spec.get("initContainers") or [{}])[0])
        self.main = dict((spec.get("containers") or [{}])[0])

    # --- the world -----------------------------------------------------------------------------------

    def _pod(self) -> Obj | None:
        pod = self.cluster.store.get(POD_KEY, self.loc)
        return pod if pod is not None and pod["metadata"].get("uid") == self.uid else None

    def _alive(self) -> bool:
        pod = self._pod()
        return pod is not None and not pod["metadata"].get("deletionTimestamp")

    def _log(self, container: dict[str, Any], line: str) -> None:
        self.cluster.logs.append((self.loc[0], self.loc[1], str(container.get("name", ""))), line,
                                 self.cluster.clock())

    def _wait(self, seconds: float) -> bool:
        """Let ``seconds`` of simulated time pass; False if the pod went away meanwhile."""
        due = self.cluster.clock() + seconds
        while self.cluster.clock() < due:
            if not self._alive():
                return False
            time.sleep(STEP)
        return self._alive()

    def _env(self, name: str) -> str | None:
        """An environment variable of the init container as the kubelet resolves it (a ``secretKeyRef`` read
        from the pod's namespace); None when unset or its Secret or key is missing."""
        for item in self.init.get("env") or []:
            if item.get("name") != name:
                continue
            if "value" in item:
                return str(item["value"])
            ref = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
            secret = self.cluster.store.get(("", "secrets"), (self.loc[0], str(ref.get("name", ""))))
            data = (secret or {}).get("data") or {}
            return "set" if data.get(str(ref.get("key", ""))) else None
        return None

    # --- the run -------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            options, positional = parse_download_args(self.argv)
        except ValueError as exc:
            for line in (USAGE, "Try 'hf download -h' for help.", "", f"Error: {exc}"):
                self._log(self.init, line)
            self._end(init_exit=2)
            return
        repo = positional[0]
        local_dir = (options.get("--local-dir") or [""])[-1]
        token = self._env("HF_TOKEN") or (options.get("--token") or [""])[-1]
        if repo.split("/", 1)[0] in GATED_ORGS and not token:
            self._gated(repo, (options.get("--revision") or ["main"])[-1])
            return
        files = {name: body for name, body in model_files(repo).items()
                 if _wanted(name, positional[1:], options.get("--include"), options.get("--exclude"))}
        if not self._fetch(files):
            return
        self._log(self.init, local_dir or f"/root/.cache/huggingface/hub/models--{repo.replace('/', '--')}")
        self._end(init_exit=0, copy=(local_dir, files))

    def _gated(self, repo: str, revision: str) -> None:
        url = f"{HUB}/{repo}/resolve/{revision}/config.json"
        request = hashlib.sha256(f"{self.uid}{repo}".encode()).hexdigest()
        for line in (
                "Traceback (most recent call last):",
                "huggingface_hub.errors.GatedRepoError: 401 Client Error. "
                f"(Request ID: Root=1-{request[:8]}-{request[8:32]};{request[32:68]})",
                "",
                f"Cannot access gated repo for url {url}.",
                f"Access to model {repo} is restricted. You must have access to it and be authenticated to "
                "access it. Please log in."):
            self._log(self.init, line)
        self._end(init_exit=1)

    def _fetch(self, files: dict[str, bytes]) -> bool:
        total = len(files)
        self._log(self.init, f"Fetching {total} files:   0%|          | 0/{total} [00:00<?, ?it/s]")
        for done, (name, body) in enumerate(sorted(files.items()), start=1):
            size = len(body)
            self._log(self.init, f"{name}:   0%|          | 0.00/{_human(size)} [00:00<?, ?B/s]")
            if not self._wait(SECONDS_PER_FILE):
                return False
            rate = _human(size / SECONDS_PER_FILE)
            self._log(self.init, f"{name}: 100%|██████████| {_human(size)}/{_human(size)} "
                                 f"[00:01<00:00, {rate}B/s]")
            self._log(self.init, f"Fetching {total} files: {int(100 * done / total):3d}%|{_bar(done, total)}| "
                                 f"{done}/{total} [00:{done:02d}<00:00, {1 / SECONDS_PER_FILE:.2f}it/s]")
        return True

    def _copy(self, local_dir: str, files: dict[str, bytes]) -> str | None:
        """The main container's ``cp``: each file to the mounted bucket; an error message, or None."""
        command = [str(a) for a in (self.main.get("command") or []) + (self.main.get("args") or [])]
        target = command[-1].rstrip("/") if command else ""
        bucket, key_prefix = self._bucket_of(target)
        if bucket is None:
            return f"cp: cannot create directory '{target}': No such file or directory"
        for name, body in sorted(files.items()):
            self._log(self.main, f"'{local_dir}/./{name}' -> '{target}/./{name}'")
            if self.store is not None:
                self.store(bucket, key_prefix + name, body)
        return None

    def _bucket_of(self, path: str) -> tuple[str | None, str]:
        """The bucket and key prefix a path in the main container lands at: its Mountpoint volume's bucket,
        that volume's ``prefix`` mount option, then the path under the mount."""
        spec = self._pod_spec()
        for mount in self.main.get("volumeMounts") or []:
            mount_path = str(mount.get("mountPath", "")).rstrip("/")
            if not (path == mount_path or path.startswith(mount_path + "/")):
                continue
            volume: dict[str, Any] = next((v for v in spec.get("volumes") or []
                                           if v.get("name") == mount.get("name")), {})
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            pvc = self.cluster.store.get(("", "persistentvolumeclaims"), (self.loc[0], str(claim)))
            pv_name = ((pvc or {}).get("spec") or {}).get("volumeName")
            pv = self.cluster.store.get(("", "persistentvolumes"), ("", str(pv_name))) if pv_name else None
            csi = ((pv or {}).get("spec") or {}).get("csi") or {}
            bucket = (csi.get("volumeAttributes") or {}).get("bucketName")
            if csi.get("driver") != "s3.csi.aws.com" or not bucket:
                return None, ""
            prefix = next((str(o).split(" ", 1)[1] for o in (pv or {}).get("spec", {}).get("mountOptions") or []
                           if str(o).startswith("prefix ")), "")
            under = path[len(mount_path):].strip("/")
            return str(bucket), prefix + (under + "/" if under else "")
        return None, ""

    def _pod_spec(self) -> dict[str, Any]:
        return dict((self._pod() or {}).get("spec") or {})

    def _end(self, *, init_exit: int, copy: tuple[str, dict[str, bytes]] | None = None) -> None:
        """Write the pod's final status: the init container's exit, then (if it succeeded) the copy's."""
        main_exit: int | None = None
        if init_exit == 0 and copy is not None:
            error = self._copy(*copy)
            if error is not None:
                self._log(self.main, error)
            main_exit = 1 if error is not None else 0
        pod = self._pod()
        if pod is None:
            return
        now = self.cluster.now_iso()
        status = dict(pod.get("status") or {})
        started = status.get("startTime", now)
        ok = init_exit == 0 and main_exit == 0
        status["phase"] = "Succeeded" if ok else "Failed"
        status["initContainerStatuses"] = [_terminated(self.init, init_exit, started, now)]
        status["containerStatuses"] = [
            _terminated(self.main, main_exit, started, now) if main_exit is not None else
            {**_image(self.main), "ready": False, "started": False,
             "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]
        status["conditions"] = [{**c, "status": "False", "reason": "PodCompleted" if ok else "PodFailed"}
                                if c.get("type") in ("Ready", "ContainersReady") else c
                                for c in status.get("conditions") or []]
        body = {**pod, "metadata": {**pod["metadata"]}, "status": status}
        from .cluster import WriteOptions

        try:
            self.cluster.replace(self.cluster.builtin("", "pods"), self.loc[0], self.loc[1], body,
                                 WriteOptions(manager="kubelet"), "status")
        except ApiError as exc:  # deleted or changed meanwhile
            log.info("pod %s/%s: its final status was not written: %s", *self.loc, exc)
        for container in (self.init, self.main):
            self.cluster.logs.terminate((self.loc[0], self.loc[1], str(container.get("name", ""))))


def _image(container: dict[str, Any]) -> dict[str, Any]:
    image = str(container.get("image"))
    return {"name": container.get("name"), "image": image,
            "imageID": f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"}


def _terminated(container: dict[str, Any], code: int | None, started: str, now: str) -> dict[str, Any]:
    return {**_image(container), "ready": False, "started": False,
            "restartCount": 0, "state": {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": started,
                "finishedAt": now}}}


def _wanted(name: str, filenames: list[str], include: list[str] | None, exclude: list[str] | None) -> bool:
    """``hf download``'s selection: named files, else ``--include``/``--exclude`` glob patterns."""
    if filenames:
        return name in filenames
    if include and not any(fnmatch.fnmatch(name, p) for p in include):
        return False
    return not (exclude and any(fnmatch.fnmatch(name, p) for p in exclude))


def moto_object_store(forward: Callable[[str, str, dict[str, str], bytes], Any], region: str) -> ObjectStore:
    """An :data:`ObjectStore` writing through the sandbox's moto (``MotoBackend.forward``: logged, so the
    objects survive a restart like every other S3 write)."""
    def put(bucket: str, key: str, body: bytes) -> None:
        headers = {"Authorization": f"AWS4-HMAC-SHA256 Credential=sandbox/20260101/{region}/s3/aws4_request, "
                                    "SignedHeaders=host, Signature=sandbox",
                   "Content-Length": str(len(body)), "Content-Type": "application/octet-stream"}
        from urllib.parse import quote

        answer = forward("PUT", f"/{bucket}/{quote(key)}", headers, body)
        try:
            answer.read()
            if answer.status >= 300:
                log.warning("simulated Mountpoint write of s3://%s/%s answered %s", bucket, key, answer.status)
        finally:
            answer.close()
    return put
