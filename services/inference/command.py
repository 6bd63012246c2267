"""The user's serve command, read the way the engine's own argument parser would read it.

A self-managed deployment runs exactly the command the user would type on a GPU box: ``vllm serve MODEL
[flags]`` (or ``python[3] -m vllm.entrypoints.openai.api_server --model MODEL [flags]``) in the pinned vLLM
image, ``python[3] -m sglang.launch_server --model-path MODEL [flags]`` in the pinned SGLang image. The engine
exits with an argparse error on a flag it does not have, hours of GPU time later than necessary, so the
command is checked here against the flag lists in ``engine_flags.yaml`` (recorded from the engines' sources,
see ``SOURCES.md``) and refused with the closest real flag. What the rest of the product needs is read out of
it: the model, the listening port, the tensor- and pipeline-parallel sizes and the served model name.

Flags that would put a secret on the command line (``--hf-token``, ``--api-key``) are refused: a Deployment's
args are readable by anyone who can read the Deployment; the Hugging Face token goes through the request's
``hf_token`` into a Kubernetes Secret instead. So is a leading ``NAME=value`` (a shell's environment
assignment, e.g. ``HF_TOKEN=hf_… vllm serve …``). A refusal never repeats a value that could be a secret:
a Hugging Face token anywhere in what it quotes is shown as ``hf_…``.
"""

from __future__ import annotations

import difflib
import functools
import re
import shlex
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from services.errors import Invalid
from services.inference.models import Engine

#: the image each engine runs in (the tag the flag lists were recorded against, see SOURCES.md)
IMAGES: dict[Engine, str] = {Engine.VLLM: "vllm/vllm-openai:v0.11.0", Engine.SGLANG: "lmsysorg/sglang:v0.5.4"}
DEFAULT_PORTS: dict[Engine, int] = {Engine.VLLM: 8000, Engine.SGLANG: 30000}
SECRET_FLAGS = {"--hf-token": "hf_token (kept in a Kubernetes Secret, given to the engine as HF_TOKEN)",
                "--api-key": "nothing: the control plane's test call and the Service are the way in; an API key on "
                             "the command line is readable by anyone who can read the Deployment"}
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
MAX_COMMAND = 4000

_TOKEN = re.compile(r"hf_[A-Za-z0-9]{20,}")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
_VLLM_MODULE = "vllm.entrypoints.openai.api_server"
_SGLANG_MODULE = "sglang.launch_server"


@dataclass(frozen=True)
class FlagSpec:
    flags: frozenset[str]
    aliases: dict[str, str]
    allow_abbrev: bool
    negatable: frozenset[str]  # the flags argparse's BooleanOptionalAction also gives a --no- form
    switches: frozenset[str]  # flags that take no value (store_true, and the negatable ones)
    values: frozenset[str]  # flags that take one or more values (nargs="+")


def shown(text: str) -> str:
    """``text`` as a refusal may quote it: Hugging Face tokens replaced by ``hf_…``."""
    return _TOKEN.sub("hf_…", text)


@functools.cache
def flag_specs() -> dict[Engine, FlagSpec]:
    text = resources.files("services").joinpath("inference/engine_flags.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    specs: dict[Engine, FlagSpec] = {}
    for name, spec in data.items():
        negatable = frozenset(spec.get("negatable") or [])
        specs[Engine(name)] = FlagSpec(flags=frozenset(spec["flags"]), aliases=dict(spec["aliases"]),
                                       allow_abbrev=bool(spec["allow_abbrev"]), negatable=negatable,
                                       switches=frozenset(spec.get("switches") or []) | negatable,
                                       values=frozenset(spec.get("values") or []))
    return specs


@dataclass(frozen=True)
class ServeCommand:
    """What the product reads out of a serve command (argv is what the container runs)."""

    engine: Engine
    argv: list[str]
    model: str
    port: int
    tensor_parallel: int
    pipeline_parallel: int
    served_model_name: str | None
    flags: dict[str, str | None] = field(default_factory=dict)

    @property
    def gpus_needed(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def api_model(self) -> str:
        """The model name requests must carry (the engines answer 404 to any other)."""
        return self.served_model_name or self.model


def _split(command: str) -> list[str]:
    if len(command) > MAX_COMMAND:
        raise Invalid(f"the serve command is {len(command)} characters; at most {MAX_COMMAND}")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise Invalid(f"the serve command does not parse as a shell command line: {exc}") from None
    if not argv:
        raise Invalid("the serve command is empty; e.g. 'vllm serve Qwen/Qwen2.5-0.5B-Instruct'")
    assignment = _ASSIGNMENT.match(argv[0])
    if assignment is not None:  # its value is not repeated: it is often the token
        raise Invalid(f"the serve command starts with an environment assignment ({assignment.group(1)}=…): the "
                      "product sets the engine's environment; give the Hugging Face token as hf_token (kept in a "
                      "Kubernetes Secret) and start the command with the engine",
                      details={"variable": assignment.group(1)})
    return argv


def _engine(argv: list[str]) -> tuple[Engine, list[str], str | None]:
    """The engine, the rest of the arguments, and the positional model of ``vllm serve MODEL``."""
    head = argv[0].rsplit("/", 1)[-1]
    if head == "vllm":
        if len(argv) < 2 or argv[1] != "serve":
            raise Invalid("a vLLM command starts 'vllm serve MODEL'")
        rest = argv[2:]
        if rest and not rest[0].startswith("-"):
            return Engine.VLLM, rest[1:], rest[0]
        return Engine.VLLM, rest, None
    if head in ("python", "python3") and len(argv) >= 3 and argv[1] == "-m":
        if argv[2] == _VLLM_MODULE:
            return Engine.VLLM, argv[3:], None
        if argv[2] == _SGLANG_MODULE:
            return Engine.SGLANG, argv[3:], None
    raise Invalid(f"unknown serve command {shown(' '.join(argv[:3]))!r}: use 'vllm serve MODEL …', 'python3 -m "
                  f"{_VLLM_MODULE} --model MODEL …' or 'python3 -m {_SGLANG_MODULE} --model-path MODEL …'")


def canonical(engine: Engine, written: str) -> str:
    """The flag ``written`` stands for (an alias, a ``--no-`` form, an abbreviation); :class:`Invalid` naming
    the closest real flag when the engine has none."""
    spec = flag_specs()[engine]
    if written in spec.flags:
        return written
    if written in spec.aliases:
        return spec.aliases[written]
    if written.startswith("--no-") and "--" + written[5:] in spec.negatable:
        return "--" + written[5:]
    if spec.allow_abbrev and written.startswith("--"):
        matches = sorted(f for f in spec.flags | set(spec.aliases) if f.startswith(written))
        resolved = {spec.aliases.get(m, m) for m in matches}
        if len(resolved) == 1:
            return resolved.pop()
        if len(resolved) > 1:
            raise Invalid(f"{shown(written)} is ambiguous for {engine.value}: it could be "
                          f"{', '.join(sorted(resolved))}", details={"flag": shown(written),
                                                                      "candidates": sorted(resolved)})
    close = difflib.get_close_matches(written, sorted(spec.flags | set(spec.aliases)), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise Invalid(f"{engine.value} has no flag {shown(written)}{hint}",
                  details={"flag": shown(written), "engine": engine.value, "suggestions": close})


def _options(engine: Engine, args: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """Flags (canonical name -> its value, None for a switch, the words joined by a space for a flag taking
    several) and the positionals left over."""
    spec = flag_specs()[engine]
    found: dict[str, str | None] = {}
    positionals: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            i += 1
            continue
        written, eq, inline = token.partition("=")
        name = canonical(engine, written)
        if name in SECRET_FLAGS:
            raise Invalid(f"{shown(written)} would put a secret on the command line; use {SECRET_FLAGS[name]}",
                          details={"flag": shown(written)})
        if eq:
            found[name] = inline
            i += 1
        elif name in spec.switches:
            found[name] = None
            i += 1
        elif name in spec.values:
            j = i + 1
            while j < len(args) and not _option(args[j]):
                j += 1
            found[name] = " ".join(args[i + 1:j]) or None
            i = j
        elif i + 1 < len(args) and not _option(args[i + 1]):
            found[name] = args[i + 1]
            i += 2
        else:
            found[name] = None
            i += 1
    return found, positionals


def _option(token: str) -> bool:
    return token.startswith("--") or _short_flag(token)


def _short_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not token[1].isdigit() and token[1] != "."


def _int(flags: dict[str, str | None], name: str, default: int, low: int = 1, high: int = 65535) -> int:
    value = flags.get(name)
    if name not in flags:
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise Invalid(f"{name} needs a whole number, got {shown(str(value))!r}", details={"flag": name}) from None
    if not low <= number <= high:
        raise Invalid(f"{name} must be between {low} and {high}, got {number}", details={"flag": name})
    return number


def parse(command: str) -> ServeCommand:
    """Read a serve command (see the module docstring); :class:`Invalid` (422) for anything the engine would
    refuse or the product cannot serve."""
    argv = _split(command)
    engine, rest, model = _engine(argv)
    flags, positionals = _options(engine, rest)
    if model is None and positionals and argv[1:2] == ["serve"]:  # `vllm serve [options] MODEL`: argparse's
        model, positionals = positionals[0], positionals[1:]      # optional model_tag may follow options
    if positionals:
        quoted = [shown(p) for p in positionals]
        raise Invalid(f"unexpected argument(s) {quoted} in the {engine.value} command",
                      details={"arguments": quoted})
    model_flag = "--model" if engine is Engine.VLLM else "--model-path"
    if model is None:
        model = flags.get(model_flag)
    elif model_flag in flags:
        raise Invalid("give the model once: as 'vllm serve MODEL' or as --model, not both")
    if not model:
        raise Invalid(f"the {engine.value} command names no model: "
                      + ("'vllm serve MODEL'" if engine is Engine.VLLM else "--model-path MODEL"))
    host = flags.get("--host")
    if host in LOCAL_HOSTS:
        raise Invalid(f"--host {host} listens only inside the container, so the Service cannot reach the engine; "
                      "drop --host (the product listens on 0.0.0.0)", details={"flag": "--host"})
    if "--uds" in flags:
        raise Invalid("--uds serves on a Unix socket the Service cannot reach; drop it", details={"flag": "--uds"})
    port = _int(flags, "--port", DEFAULT_PORTS[engine], low=1024)
    tp_flag, pp_flag = (("--tensor-parallel-size", "--pipeline-parallel-size") if engine is Engine.VLLM
                        else ("--tp-size", "--pp-size"))
    argv = list(argv)
    if engine is Engine.SGLANG and "--host" not in flags:
        argv += ["--host", "0.0.0.0"]  # SGLang listens on 127.0.0.1 unless told otherwise
    return ServeCommand(engine=engine, argv=argv, model=str(model), port=port,
                        tensor_parallel=_int(flags, tp_flag, 1, high=64), pipeline_parallel=_int(flags, pp_flag, 1,
                                                                                                 high=64),
                        served_model_name=flags.get("--served-model-name") or None, flags=flags)
