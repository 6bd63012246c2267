"""The inference engines' command lines and the contract a pod must honour for them to start.

Which container runs which engine (:func:`identify`): vLLM as ``vllm serve [MODEL] [flags]``,
``python3 -m vllm.entrypoints.openai.api_server [flags]``, or flags alone on a ``vllm/vllm-openai`` image (its
entrypoint is ``vllm serve``); SGLang as ``python3 -m sglang.launch_server --model-path M [flags]``. The flags
are parsed as argparse parses them, from the flag lists recorded as data in ``engines/`` (``SOURCES.md``):
an unknown flag fails like argparse (exit 2, ``unrecognized arguments``), so do a flag without its value, a
non-integer where the engine takes an int and an ambiguous prefix (SGLang's parser takes an unambiguous one).
:func:`check_pod` then applies what the pod must provide: the port declared as a ``containerPort``, GPUs
requested, tensor x pipeline parallel size within the ``nvidia.com/gpu`` limit, a Hugging Face token only from a
Secret, a token for a gated model, the shared storage mounted under ``/s3`` for a model there. Each failure
carries the engine's kind of message.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .store import Obj

ENGINE_DIR = Path(__file__).parent / "engines"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
SGLANG_MODULE = "sglang.launch_server"
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
GATED_ORGS = ("meta-llama/", "mistralai/", "google/gemma")  # Hugging Face repos that ask for an accepted licence
SHARED_STORAGE = "/s3"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Spec:
    engine: str
    default_port: int
    model_flag: str
    served_name_flag: str
    port_flag: str
    int_flags: frozenset[str]
    aliases: dict[str, str]
    value: frozenset[str]
    switch: frozenset[str]
    optional: frozenset[str]
    values: frozenset[str]  # nargs="+": one or more words
    any_values: frozenset[str]  # nargs="*": zero or more words
    negatable: frozenset[str]
    allow_abbrev: bool  # argparse's default: an unambiguous prefix of a --flag stands for it

    @property
    def known(self) -> frozenset[str]:
        return (self.value | self.switch | self.optional | self.values | self.any_values | self.negatable
                | frozenset(self.aliases))


@functools.cache
def spec(engine: str) -> Spec:
    data: dict[str, Any] = yaml.safe_load((ENGINE_DIR / f"{engine}.yaml").read_text())
    return Spec(engine=data["engine"], default_port=int(data["default_port"]), model_flag=data["model_flag"],
                served_name_flag=data["served_name_flag"], port_flag=data["port_flag"],
                int_flags=frozenset(data["int_flags"]), aliases=dict(data["aliases"]),
                allow_abbrev=bool(data.get("allow_abbrev", False)),
                **{k: frozenset(data.get(k) or []) for k in ("value", "switch", "optional", "values", "any_values",
                                                              "negatable")})


HUMAN_INT_FLAGS = frozenset({"--max-model-len"})  # vLLM parses these with its human_readable_int
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_int(value: str) -> int | None:
    """vLLM's ``human_readable_int``: ``4096``, ``32k`` (x 1,000, decimals allowed), ``32K`` (x 1,024, whole
    numbers only); None for anything else."""
    text = value.strip()
    if text.isdigit():
        return int(text)
    match = _HUMAN.fullmatch(text)
    if match is None:
        return None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix] if number.isdigit() else None


class EngineError(Exception):
    """The engine refuses to start: ``lines`` go to its log, ``exit_code`` is the process's."""

    def __init__(self, lines: list[str], exit_code: int = 1) -> None:
        super().__init__(lines[-1] if lines else "")
        self.lines = lines
        self.exit_code = exit_code


@dataclass
class Invocation:
    engine: str  # "vllm" or "sglang"
    usage: str
    args: dict[str, str | list[str] | bool] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)

    @property
    def spec(self) -> Spec:
        return spec(self.engine)

    def get(self, flag: str, default: str = "") -> str:
        value = self.args.get(flag)
        if isinstance(value, list):
            return value[0] if value else default
        return default if value is None or isinstance(value, bool) else value

    @property
    def model(self) -> str:
        return self.get(self.spec.model_flag) or (self.positional[0] if self.positional else "")

    @property
    def served_name(self) -> str:
        return self.get(self.spec.served_name_flag) or self.model

    @property
    def port(self) -> int:
        return int(self.get(self.spec.port_flag) or self.spec.default_port)

    def size(self, flag: str) -> int:
        return int(self.get(flag) or 1)


def engine_argv(container: dict[str, Any]) -> tuple[str, str, list[str]] | None:
    """(engine, usage prefix, its arguments) when the container runs an inference engine's server."""
    command = [str(w) for w in container.get("command") or []]
    argv = command + [str(w) for w in container.get("args") or []]
    image = str(container.get("image", ""))
    if not command and "vllm-openai" in image.rsplit("/", 1)[-1]:
        return "vllm", "vllm serve", argv  # the image's entrypoint is `vllm serve`
    if argv[:2] == ["vllm", "serve"] or (argv and argv[0].endswith("/vllm") and argv[1:2] == ["serve"]):
        return "vllm", "vllm serve", argv[2:]
    if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1].startswith("python") and argv[1] == "-m":
        if argv[2] == VLLM_MODULE:
            return "vllm", "api_server.py", argv[3:]
        if argv[2] == SGLANG_MODULE:
            return "sglang", "launch_server.py", argv[3:]
    return None


def parse(engine: str, usage: str, argv: list[str]) -> Invocation:
    """Parse ``argv`` as the engine's argparse parser would; :class:`EngineError` (exit 2) as argparse fails."""
    s = spec(engine)
    inv = Invocation(engine, usage)
    unknown: list[str] = []
    i = 0

    def fail(message: str) -> EngineError:
        return EngineError([f"usage: {usage} [options]", f"{usage}: error: {message}"], exit_code=2)

    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("-") or word == "-":
            if engine == "vllm" and not inv.positional:  # `vllm serve MODEL`: the optional model_tag
                inv.positional.append(word)
            else:
                unknown.append(word)
            continue
        name, eq, attached = word.partition("=")
        if name.startswith("-O") and len(name) > 2 and engine == "vllm" and not eq:  # -O3 is -O 3
            name, eq, attached = "-O", "=", name[2:]
        written = _prefixed(s, name, fail)
        flag = s.aliases.get(written, written)
        if flag.startswith("--no-") and "--" + flag[5:] in s.negatable and not eq:
            inv.args["--" + flag[5:]] = False
        elif flag in s.switch or flag in s.negatable:
            if eq:
                raise fail(f"argument {name}: ignored explicit argument {attached!r}")
            inv.args[flag] = True
        elif flag in s.optional:
            if eq:
                inv.args[flag] = attached
            elif i < len(argv) and not _is_option(argv[i]):
                inv.args[flag] = argv[i]
                i += 1
            else:
                inv.args[flag] = True
        elif flag in s.value:
            if eq:
                value = attached
            elif i < len(argv) and not _is_option(argv[i]):
                value = argv[i]
                i += 1
            else:
                raise fail(f"argument {name}: expected one argument")
            if flag in s.int_flags and not value.lstrip("-").isdigit():
                raise fail(f"argument {name}: invalid int value: {value!r}")
            if flag in HUMAN_INT_FLAGS and human_int(value) is None:
                raise fail(f"argument {name}: invalid human_readable_int value: {value!r}")
            inv.args[flag] = value
        elif flag in s.values or flag in s.any_values:
            taken = [attached] if eq else []
            while not eq and i < len(argv) and not _is_option(argv[i]):
                taken.append(argv[i])
                i += 1
            if not taken and flag in s.values:
                raise fail(f"argument {name}: expected at least one argument")
            inv.args[flag] = taken
        else:
            unknown.append(word)
    if unknown:
        raise fail("unrecognized arguments: " + " ".join(unknown))
    if engine == "sglang" and not inv.get(s.model_flag):
        raise fail("the following arguments are required: --model-path/--model")
    return inv


def _prefixed(s: Spec, name: str, fail: Callable[[str], EngineError]) -> str:
    """argparse's option lookup where ``allow_abbrev`` is on: a --name no flag has exactly stands for the one
    flag (with its aliases) it begins; more than one is argparse's ambiguity error."""
    if not s.allow_abbrev or not name.startswith("--") or name in s.known:
        return name
    found = sorted(f for f in s.known if f.startswith(name))
    if len({s.aliases.get(f, f) for f in found}) > 1:
        raise fail(f"ambiguous option: {name} could match {', '.join(found)}")
    return found[0] if found else name


def _is_option(word: str) -> bool:
    """argparse's test: a word starting with ``-`` is an option unless it reads as a negative number."""
    return word.startswith("-") and word != "-" and re.fullmatch(r"-\d+(\.\d+)?", word) is None


def _gpu_limit(container: dict[str, Any]) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    raw = str(limits.get(GPU, "0"))
    return int(raw) if raw.isdigit() else 0


def _token_env(container: dict[str, Any]) -> dict[str, Any] | None:
    return next((e for e in container.get("env") or [] if e.get("name") in TOKEN_ENV), None)


def check_pod(inv: Invocation, pod: Obj, container: dict[str, Any], secret: Any) -> bool:
    """Raise :class:`EngineError` where the pod breaks the engine's contract; True when a token is provided.
    ``secret(name, key)`` tells whether the Secret holds that key."""
    name = container.get("name", "")
    ports = {int(p["containerPort"]) for p in container.get("ports") or [] if str(p.get("containerPort", "")).isdigit()}
    if inv.port not in ports:
        raise EngineError([f"ERROR: the server listens on port {inv.port} ({inv.spec.port_flag}, default "
                           f"{inv.spec.default_port}), which container {name!r} does not declare as a containerPort "
                           f"(declared: {sorted(ports) or 'none'}); the Service and probes cannot reach it"])
    gpus = _gpu_limit(container)
    if gpus <= 0:
        raise EngineError(["RuntimeError: No CUDA GPUs are available" if inv.engine == "sglang" else
                           "RuntimeError: Failed to infer device type (no GPU visible: the container requests no "
                           f"{GPU})"])
    if inv.engine == "vllm":
        tp, pp = inv.size("--tensor-parallel-size"), inv.size("--pipeline-parallel-size")
    else:
        tp, pp = inv.size("--tp-size"), inv.size("--pp-size")
    if tp * pp > gpus:
        raise EngineError([f"ValueError: World size ({tp * pp}) = tensor parallel size ({tp}) x pipeline parallel "
                           f"size ({pp}) is larger than the number of available GPUs ({gpus}, the container's "
                           f"{GPU} limit)"])
    token = _token_env(container)
    if token is not None and "value" in token:
        raise EngineError([f"ERROR: {token['name']} is set as a plain value in the pod spec: the Hugging Face "
                           "token must come from a Secret (env valueFrom.secretKeyRef), never a literal value"])
    has_token = False
    if token is not None:
        ref = (token.get("valueFrom") or {}).get("secretKeyRef") or {}
        has_token = bool(ref) and secret(str(ref.get("name", "")), str(ref.get("key", "")))
    model = inv.model
    if model.startswith(GATED_ORGS) and not has_token:
        raise EngineError([
            "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-sandbox)",
            f"Cannot access gated repo for url https://huggingface.co/{model}/resolve/main/config.json.",
            f"Access to model {model} is restricted. You must have access to it and be authenticated to access it. "
            "Please log in."])
    if model == SHARED_STORAGE or model.startswith(SHARED_STORAGE + "/"):
        mounts = [str(m.get("mountPath", "")).rstrip("/") for m in container.get("volumeMounts") or []]
        if not any(model == m or model.startswith(m + "/") for m in mounts if m.startswith(SHARED_STORAGE)):
            raise EngineError([f"ValueError: Invalid repository ID or local directory specified: '{model}'. "
                               f"Please verify: 1. the local directory exists ({SHARED_STORAGE}, the shared "
                               "storage, is not mounted in this container)"])
    return has_token
