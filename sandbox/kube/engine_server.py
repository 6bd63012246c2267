"""The HTTP server of a simulated inference engine (vLLM or SGLang), once its model is "loaded".

Served routes: ``GET /health`` (200), ``GET /v1/models``, ``POST /v1/chat/completions`` and
``POST /v1/completions`` (OpenAI-compatible JSON; ``stream: true`` answers server-sent events ending in
``data: [DONE]``), ``GET /metrics`` (Prometheus text with the engine's own metric names; SGLang serves it only
with ``--enable-metrics``). Completions are deterministic: the words come from a hash of the prompt, their
count is ``max_tokens`` (``max_completion_tokens``; default 16) or the prompt's natural length when shorter
(``finish_reason`` ``length`` or ``stop``); ``usage`` counts whitespace-separated words as tokens. Every answer
names the pod that served it: the ``x-sandbox-pod`` header and ``system_fingerprint``. A request for another
model answers 404 in the engine's error shape. Time to first token and latency are simulated from the token
counts (no request waits).

Tests can hold answers (sandbox only, no real engine has these paths): ``POST /sandbox/hold`` makes every
completion that arrives wait, counted as running, until ``POST /sandbox/release`` (or :data:`HOLD_CAP` seconds),
so "two requests in flight" is a state a test reaches without timing.

With an API key (``--api-key``; for vLLM also ``VLLM_API_KEY`` in the environment) a request without
``Authorization: Bearer <key>`` answers 401 ``{"error": "Unauthorized"}`` as the engines' middleware does:
vLLM guards the paths under ``/v1``, SGLang every path but ``/health*`` and ``/metrics*``; ``OPTIONS`` passes.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .backends import Request, Response

DEFAULT_MAX_TOKENS = 16
_WORDS = ("the", "model", "answers", "in", "a", "simulated", "sandbox", "with", "tokens", "drawn", "from", "its",
          "prompt", "so", "every", "run", "reads", "alike", "and", "tests", "can", "compare", "them", "exactly")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
HOLD_CAP = 120.0  # a held answer goes out after this long even if no test releases it
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        counts = self.counts or [0] * len(self.buckets)
        out = [f'{name}_bucket{{le="{b}",{labels}}} {float(c)}' for b, c in zip(self.buckets, counts, strict=True)]
        out.append(f'{name}_bucket{{le="+Inf",{labels}}} {float(self.n)}')
        return [*out, f"{name}_count{{{labels}}} {float(self.n)}", f"{name}_sum{{{labels}}} {self.total}"]


@dataclass
class EngineServer:
    """One engine's server state: what it serves and what it counted."""

    engine: str  # "vllm" or "sglang"
    model: str
    served_name: str
    pod: str
    metrics_enabled: bool = True
    max_model_len: int = 4096
    api_key: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    running: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    ttft: _Histogram = field(default_factory=lambda: _Histogram(TTFT_BUCKETS))
    latency: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    released: threading.Event = field(default_factory=lambda: _set(threading.Event()))

    def __call__(self, request: Request) -> Response:
        if self._refused(request):
            return self._json(401, {"error": "Unauthorized"})
        route = (request.method, request.path.rstrip("/") or "/")
        if route in (("GET", "/health"), ("HEAD", "/health")):
            return self._answer(200, b"", "text/plain")
        if route == ("GET", "/v1/models"):
            return self._json(200, {"object": "list", "data": [{
                "id": self.served_name, "object": "model", "created": self.created, "owned_by": self.engine,
                "root": self.model, "parent": None, "max_model_len": self.max_model_len}]})
        if route == ("GET", "/metrics"):
            if not self.metrics_enabled:
                return self._json(404, {"detail": "Not Found"})
            return self._answer(200, self.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        if route in (("POST", "/sandbox/hold"), ("POST", "/sandbox/release")):
            (self.released.clear if route[1] == "/sandbox/hold" else self.released.set)()
            return self._json(200, {"held": not self.released.is_set()})
        if route in (("POST", "/v1/chat/completions"), ("POST", "/v1/completions")):
            return self._complete(request, chat=route[1].endswith("chat/completions"))
        if request.path.rstrip("/") in ("/health", "/v1/models", "/metrics", "/v1/chat/completions",
                                        "/v1/completions"):
            return self._json(405, {"detail": "Method Not Allowed"})
        return self._json(404, {"detail": "Not Found"})

    def _refused(self, request: Request) -> bool:
        if not self.api_key or request.method == "OPTIONS":
            return False
        if self.engine == "vllm":
            guarded = request.path.startswith("/v1")
        else:
            guarded = not request.path.startswith(("/health", "/metrics"))
        return guarded and request.header("Authorization") != f"Bearer {self.api_key}"

    # --- responses --------------------------------------------------------------------------------------

    def _answer(self, status: int, body: bytes, content_type: str) -> Response:
        return Response(status, body, [("content-type", content_type), ("x-sandbox-pod", self.pod)])

    def _json(self, status: int, body: Any) -> Response:
        return self._answer(status, json.dumps(body).encode(), "application/json")

    def _error(self, status: int, message: str, kind: str, param: str | None = None) -> Response:
        return self._json(status, {"object": "error", "message": message, "type": kind, "param": param,
                                   "code": status})

    def _complete(self, request: Request, *, chat: bool) -> Response:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return self._error(400, "Expecting value: the request body is not valid JSON", "BadRequestError")
        if not isinstance(body, dict):
            return self._error(400, "the request body must be a JSON object", "BadRequestError")
        if body.get("model", self.served_name) != self.served_name:
            return self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return self._error(400, "messages: a non-empty list of messages is required", "BadRequestError")
            prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            prompt_tokens = sum(len(str(m.get("content", "")).split()) + 4 for m in messages if isinstance(m, dict))
        else:
            raw = body.get("prompt", "")
            prompt = " ".join(map(str, raw)) if isinstance(raw, list) else str(raw)
            prompt_tokens = len(prompt.split())
        limit = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
        if not isinstance(limit, int) or limit < 1:
            return self._error(400, "max_tokens must be at least 1, got " + repr(limit), "BadRequestError")
        with self._lock:
            self.running += 1
        self.released.wait(HOLD_CAP)
        words, reason = _generate(prompt, limit)
        text = " ".join(words)
        ident = hashlib.sha256(f"{self.pod}/{prompt}/{time.time_ns()}".encode()).hexdigest()[:32]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                 "total_tokens": prompt_tokens + len(words)}
        fingerprint = f"sandbox-{self.engine}-{self.pod}"
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": reason}
            answer = {"id": f"chatcmpl-{ident}", "object": "chat.completion", "created": int(time.time()),
                      "model": self.served_name, "choices": [choice], "usage": usage,
                      "system_fingerprint": fingerprint}
        else:
            answer = {"id": f"cmpl-{ident}", "object": "text_completion", "created": int(time.time()),
                      "model": self.served_name, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                              "finish_reason": reason}],
                      "usage": usage, "system_fingerprint": fingerprint}
        self._count(prompt_tokens, len(words), reason)
        if body.get("stream") is True:
            return self._answer(200, _events(answer, words, chat).encode(), "text/event-stream; charset=utf-8")
        return self._json(200, answer)

    def _count(self, prompt_tokens: int, completion_tokens: int, reason: str) -> None:
        with self._lock:
            self.running -= 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += completion_tokens
            self.finished[reason] = self.finished.get(reason, 0) + 1
            first = 0.02 + 0.0002 * prompt_tokens
            self.ttft.observe(first)
            self.latency.observe(first + 0.01 * completion_tokens)

    # --- metrics ----------------------------------------------------------------------------------------

    def metrics(self) -> str:
        labels = f'model_name="{self.served_name}"'
        with self._lock:
            if self.engine == "vllm":
                families: list[tuple[str, str, str, list[str]]] = [
                    ("vllm:num_requests_running", "gauge", "Number of requests currently running on GPU.",
                     [f"vllm:num_requests_running{{{labels}}} {float(self.running)}"]),
                    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                     [f"vllm:num_requests_waiting{{{labels}}} 0.0"]),
                    ("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.",
                     [f"vllm:gpu_cache_usage_perc{{{labels}}} 0.0"]),
                    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                     [f"vllm:prompt_tokens_total{{{labels}}} {float(self.prompt_tokens)}"]),
                    ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                     [f"vllm:generation_tokens_total{{{labels}}} {float(self.generation_tokens)}"]),
                    ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                     [f'vllm:request_success_total{{finished_reason="{r}",{labels}}} {float(n)}'
                      for r, n in sorted(self.finished.items())]),
                    ("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
                     self.ttft.lines("vllm:time_to_first_token_seconds", labels)),
                    ("vllm:e2e_request_latency_seconds", "histogram",
                     "Histogram of end to end request latency in seconds.",
                     self.latency.lines("vllm:e2e_request_latency_seconds", labels))]
            else:
                families = [
                    ("sglang:num_running_reqs", "gauge", "The number of running requests.",
                     [f"sglang:num_running_reqs{{{labels}}} {float(self.running)}"]),
                    ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                     [f"sglang:num_queue_reqs{{{labels}}} 0.0"]),
                    ("sglang:token_usage", "gauge", "The token usage", [f"sglang:token_usage{{{labels}}} 0.0"]),
                    ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                     [f"sglang:prompt_tokens_total{{{labels}}} {float(self.prompt_tokens)}"]),
                    ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                     [f"sglang:generation_tokens_total{{{labels}}} {float(self.generation_tokens)}"]),
                    ("sglang:num_requests_total", "counter", "Number of requests processed.",
                     [f"sglang:num_requests_total{{{labels}}} {float(sum(self.finished.values()))}"]),
                    ("sglang:time_to_first_token_seconds", "histogram",
                     "Histogram of time to first token in seconds.",
                     self.ttft.lines("sglang:time_to_first_token_seconds", labels)),
                    ("sglang:e2e_request_latency_seconds", "histogram",
                     "Histogram of End-to-end request latency in seconds",
                     self.latency.lines("sglang:e2e_request_latency_seconds", labels))]
        out: list[str] = []
        for name, kind, help_text, samples in families:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(out) + "\n"


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


def _generate(prompt: str, limit: int) -> tuple[list[str], str]:
    """The words answering ``prompt``: deterministic, at most ``limit`` (``length``), else its own length."""
    digest = hashlib.sha256(prompt.encode()).digest()
    natural = 8 + digest[0] % 24
    count = min(limit, natural)
    words = [_WORDS[digest[i % len(digest)] % len(_WORDS)] for i in range(count)]
    return words, "length" if limit < natural else "stop"


def _events(answer: dict[str, Any], words: list[str], chat: bool) -> str:
    """The answer as server-sent events: one chunk per token, then the finish reason, then ``[DONE]``."""
    base = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint")}
    kind = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    for i, word in enumerate(words):
        piece = word if i == 0 else " " + word
        choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
        chunks.append({**base, "object": kind, "choices": [{**choice, "finish_reason": None}]})
    final: dict[str, Any] = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
    final["finish_reason"] = answer["choices"][0]["finish_reason"]
    chunks.append({**base, "object": kind, "choices": [final]})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
