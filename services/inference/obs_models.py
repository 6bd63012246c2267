"""Response models of the inference deployments' observability reads (engine metrics), shared by every face."""

from __future__ import annotations

from pydantic import Field

from services.models import ResponseModel


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
