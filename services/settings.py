"""Settings: environment variables (``INSTANTSTART_*``) over an optional config file over defaults.

The config file is YAML (or TOML by extension) named by ``INSTANTSTART_CONFIG`` or ``--config``; its keys
are the field names below. The data directory holds the state database, the cookie secret and generated
kubeconfigs; write access to it is the trust boundary on the host.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from services.errors import Invalid
from services.stages import DEFAULT_DEADLINE_FLOOR

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "instantstart"


class Settings(BaseSettings):
    """Everything the composition root needs to build the services and the server."""

    model_config = SettingsConfigDict(env_prefix="INSTANTSTART_", extra="forbid", validate_default=True)

    config: Path | None = Field(None, description="YAML or TOML file with any of these settings")
    data_dir: Path = Field(default_factory=_default_data_dir, description="state database, secrets, kubeconfigs")
    host: str = Field("127.0.0.1", description="address the server binds")
    port: int = Field(3099, ge=0, le=65535, description="port for dashboard, REST and WebSockets")
    region: str = Field("us-west-2", description="default AWS region")
    aws_endpoint_url: str | None = Field(None, description="override every AWS endpoint (sandbox, proxies)")
    dev_no_auth: bool = Field(False, description="loopback-only development without tokens")
    workers: int = Field(4, ge=1, le=64, description="operation worker threads")
    trust_proxy_headers: bool = Field(
        False, description="behind a TLS-terminating proxy: take scheme and client address from X-Forwarded-*"
    )
    sandbox: bool | None = Field(
        None, description="run against the embedded sandbox world; unset: only when no AWS credentials are found"
    )
    sandbox_kube_port: int = Field(3443, ge=0, le=65535,
                                   description="loopback HTTPS port of the sandbox's Kubernetes API emulator")
    sandbox_aws_port: int = Field(4566, ge=0, le=65535,
                                  description="loopback port of the sandbox's AWS endpoint (every service)")
    sandbox_speed: float = Field(40.0, gt=0, le=100_000,
                                 description="sandbox simulated seconds per real second (40: EKS create ~15 s)")
    allowed_origins: list[str] = Field(
        default_factory=list, description="extra host:port values browsers may open WebSockets from"
    )
    api_max_body_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024,
                                    description="largest REST request body; larger ones get 413 unread")
    backup_keep: int = Field(10, ge=1, le=10_000, description="backups kept in backups/; older ones are pruned")
    backup_reserve_bytes: int = Field(
        0, ge=0, description="free space to keep beyond twice the database's size before a backup is refused"
    )
    session_lifetime: float = Field(86_400, ge=60, le=30 * 86_400,
                                    description="seconds a dashboard session lasts at most after sign-in")
    session_idle_timeout: float = Field(7_200, ge=60, le=30 * 86_400,
                                        description="seconds without a request after which a session ends")
    signin_delay_base: float = Field(0.5, ge=0, le=60,
                                     description="seconds of delay after the first failed sign-in of a "
                                                 "(client address, token id); doubles with each further failure")
    signin_delay_max: float = Field(30, ge=0, le=600, description="the sign-in delay never grows past this")
    ws_max_message_bytes: int = Field(4096, ge=64, le=16 * 1024 * 1024,
                                      description="largest message a client may send on /api/v1/events")
    ws_per_principal: int = Field(8, ge=1, le=1000,
                                  description="open /api/v1/events WebSockets per token (or session)")
    longpolls_per_principal: int = Field(8, ge=1, le=1000,
                                         description="concurrent long-polls (wait/timeout > 0) per token")
    engine_pace: float | None = Field(
        None, gt=0, le=100, description="multiplier on every operation stage's poll waits, retry backoff and "
                                        "deadline; unset: 1 against AWS, 1/sandbox_speed in the sandbox")
    stage_deadline_floor: float = Field(
        DEFAULT_DEADLINE_FLOOR, ge=0, le=3600,
        description="real seconds a paced stage deadline never drops below (a sandbox at 3000x scales an hour to "
                    "1.2 s, which a loaded machine can spend on the stage's own calls); never lengthens a stage's "
                    "own deadline")
    retry_backoff_base: float = Field(1.0, gt=0, le=600,
                                      description="seconds before the first retry of a transient stage failure "
                                                  "(doubles per failure in a row, jittered)")
    shared_bucket: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
        description="the installation's shared S3 bucket (lifecycle scripts, every cluster's shared storage); "
                    "unset: instantstart-shared-<account>-<region>, ensured at first use")
    retry_backoff_max: float = Field(60.0, gt=0, le=3600,
                                     description="the transient-failure backoff never grows past this (seconds)")

    @field_validator("data_dir", mode="after")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get("INSTANTSTART_CONFIG")
        init_kwargs: dict[str, Any] = getattr(init_settings, "init_kwargs", {})
        if init_kwargs.get("config"):
            path = str(init_kwargs["config"])
        if path:
            if not Path(path).is_file():
                raise Invalid(f"config file {path} does not exist")
            if path.endswith(".toml"):
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
            else:
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    def check_bind(self) -> None:
        """Refuse to serve without auth on anything but loopback."""
        if self.dev_no_auth and self.host not in LOOPBACK_HOSTS:
            raise Invalid(
                f"--dev-no-auth serves without tokens and only binds loopback; refusing host {self.host!r}"
            )

    def ensure_data_dir(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.data_dir
