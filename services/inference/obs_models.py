"""Models of the inference deployments' observability reads (engine metrics, engine logs), shared by every face."""

from __future__ import annotations

from pydantic import Field

from services.logs.models import TEXT_MAX_LINES
from services.models import RequestModel, ResponseModel


class EndpointMetrics(ResponseModel):
    """What the engines' own Prometheus metrics say about a deployment, between its two latest scrapes."""

    ttft_p50_seconds: float | None = Field(None, description="median time to first token of the requests finished "
                                                             "in the window (histogram estimate), seconds")
    ttft_p95_seconds: float | None = Field(None, description="95th percentile time to first token, seconds")
    tokens_per_second: float | None = Field(None, description="generated tokens per second over the window, all "
                                                              "scraped pods together (None until two scrapes)")
    requests: int = Field(0, description="requests the scraped pods finished in the window")
    window_seconds: float | None = Field(None, description="seconds between the two scrapes compared (None: only "
                                                           "one scrape so far; the TTFT is then since the engines "
                                                           "started)")
    pods_scraped: int = Field(0, description="pods whose /metrics answered")
    pods_ready: int = Field(0, description="ready pods of the deployment (at most 8 are scraped)")
    note: str = Field("", description="why a figure is missing (no requests yet, metrics not served, ...)")


SINCE_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$"  # as the job logs' since


class InferenceLogQuery(RequestModel):
    """Which lines of a deployment's engine logs to read (its namespace is the deployment's)."""

    pod: str | None = Field(None, max_length=253, description="only this pod of the deployment (default: all)")
    tail: int = Field(200, ge=1, le=TEXT_MAX_LINES,
                      description=f"the last N matching lines (at most {TEXT_MAX_LINES})")
    since: str | None = Field(None, pattern=SINCE_PATTERN,
                              description="only lines at or after this UTC time (RFC 3339, e.g. 2026-01-01T10:00:00Z)")
    cursor: str | None = Field(None, max_length=65_536,
                               description="only lines after a previous read (the X-Log-Cursor header or the 'next' "
                                           "hint at its end): poll with it for new output")
    grep: str | None = Field(None, min_length=1, max_length=200,
                             description="only lines matching this regular expression (case-insensitive), e.g. "
                                         "'error|CUDA|Traceback|OOM'")
