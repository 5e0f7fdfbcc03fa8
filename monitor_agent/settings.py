"""Sidecar configuration: defaults < YAML file < ``MONITOR_AGENT_*`` env vars < CLI flags.

Nested sections use ``__`` in env names (``MONITOR_AGENT_ALERTING__SLACK__WEBHOOK_URL``).
Unknown keys are errors, and every error names the field, so a typo never silently falls
back to a default.

``monitor-agent serve --config monitor-agent.yaml --port 9600`` loads its settings so. A
flag beats the file, a secret is shown redacted, and a misspelt key is refused by name::

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     config = Path(tmp, "monitor-agent.yaml")
    ...     _ = config.write_text("port: 9500\\nretention_steps: 5000\\n"
    ...                           "alerting: {slack: {webhook_url: https://hooks.example/x}}\\n")
    ...     settings = load_settings(config, port=9600)
    ...     _ = config.write_text("retension_steps: 5000\\n")
    ...     try:
    ...         load_settings(config)
    ...     except ConfigError as exc:
    ...         print(exc)
    invalid configuration in .../monitor-agent.yaml:
      retension_steps: unknown setting (check the spelling; see docs/reference/configuration.md)
    >>> settings.port, settings.retention_steps
    (9600, 5000)
    >>> settings.redacted()["alerting"]["slack"]["webhook_url"]
    '**********'
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from monitor_agent.alerting.settings import AlertingSettings
from monitor_agent.cluster.settings import ClusterSettings
from monitor_agent.detectors.settings import DetectorSettings
from monitor_agent.errors import MonitorAgentError
from monitor_agent.records.yaml_errors import yaml_error_line

MiB = 1024 * 1024
PEER_LABEL = b"monitor-agent leader link v1"  # what the derived link credential signs


class Settings(BaseSettings):
    """Everything the sidecar can be told; see docs/reference/configuration.md."""

    model_config = SettingsConfigDict(
        env_prefix="MONITOR_AGENT_", env_nested_delimiter="__", extra="forbid"
    )

    host: str = Field("127.0.0.1", description="Bind address (0.0.0.0 inside containers).")
    port: int = Field(9400, ge=1, le=65535, description="HTTP port.")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Dotted host names the sidecar answers to, besides "
        "IP addresses, localhost, single-label service names, private suffixes (.local, "
        ".internal, .lan, .svc, ...) and this machine's own names (DNS rebinding guard; "
        "'*.example.com' matches subdomains, '*' turns the check off).",
    )
    forwarded_allow_ips: list[str] = Field(
        default_factory=list, description="Reverse proxies (IP addresses or networks) whose "
        "X-Forwarded-For / X-Forwarded-Proto headers are believed. Empty (the default): none; "
        "a request's source is the address that connected, which is what the per-source "
        "budgets (a flood of new runs' pages, notify/fairness.py) count by.")
    data_dir: Path = Field(Path("monitor-data"), description="Where the SQLite files live.")
    token: SecretStr | None = Field(None, description="Bearer token for writes and admin calls.")
    token_file: Path | None = Field(None, description="File holding the token (Docker secrets).")
    auth_reads: bool = Field(False, description="Require the token for reads too.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    max_body_bytes: int = Field(8 * MiB, ge=1024, description="Request body limit (413 above).")
    max_decompressed_bytes: int = Field(
        16 * MiB, ge=1024, description="Limit on a gzip body once inflated (gzip bombs)."
    )
    max_records_per_request: int = Field(10_000, ge=1)
    max_record_bytes: int = Field(
        4 * MiB, ge=1024, description="One record (NDJSON line, stored JSON); larger ones "
        "are rejected on their own (the rest of the batch is kept).",
    )
    max_values_per_request: int = Field(
        500_000, ge=1000, description="JSON values one body may hold (counted before "
        "parsing: what a request can make the sidecar allocate); 413 above.",
    )
    max_db_bytes: int | None = Field(
        None, ge=1 << 20, description="Cap on the database size; past it writes get 503."
    )
    retention_steps: int = Field(
        200_000, ge=100, description="Step records kept per run and rank; older are pruned."
    )
    max_step_jump: int = Field(
        100_000, ge=1, description="How far ahead of its rank's latest step a record may "
        "be (plus what the run's own pace allows since its last record); 422 beyond.",
    )
    max_attempts_per_run: int = Field(
        1000, ge=1, description="Attempts of one run id (processes that reused it, "
        "pipeline/attempts.py); records that would begin another get 422. Each attempt that "
        "replaces history costs one pass over the run's kept records.",
    )
    attempt_quiet_seconds: float = Field(
        10.0, gt=0, le=3600, description="A new process of a rank the run's current attempt "
        "already has (a relaunch, or a second job on the same run id) replaces that attempt's "
        "history only once it ended, went silent, was asked to relaunch (a rollback or stop "
        "pending), or has sent nothing for this long (or five of its step intervals, if "
        "longer); until then the new process's records get 409 and its client sends them "
        "again. Still refused after this long while the attempt keeps sending: paged as "
        "two_jobs (pipeline/attempts.py).",
    )
    max_active_runs: int = Field(
        10_000, ge=1, description="Runs held in memory; records of further new runs get 429."
    )
    max_new_runs_per_request: int = Field(
        64, ge=1, description="Runs one request may bring into memory (~150 KiB each, their "
        "detector state); records of further ones are rejected alone, to send again.",
    )
    max_new_ranks_per_request: int = Field(
        256, ge=1, description="Ranks one request may bring into memory (~35 KiB each, their "
        "counters and detector state); records of further new ones are rejected alone, to "
        "send again. A run grows to max_ranks_per_run over several requests (each rank's "
        "client, or each node's sidecar, sends its own).",
    )
    run_displace_after_seconds: float = Field(
        600.0, ge=0, description="When max_active_runs are in memory, a new run displaces "
        "the run silent longest if it has been silent this long (snapshotted first; it "
        "reloads on its next record).",
    )
    max_runs_exposed: int = Field(1000, ge=1, description="Runs rendered on /metrics.")
    max_layers_exposed: int = Field(2000, ge=0, description="Per-layer series per run and rank "
                                    "(/metrics), and names a run's charts keep per name space.")
    max_layer_names_per_run: int = Field(
        20_000, ge=1, description="Distinct layer names a run's detectors track; more are "
        "stored but not analysed (counted in monitor_agent_dropped_series_total).",
    )
    max_ranks_exposed: int = Field(256, ge=1, description="Ranks rendered per run.")
    max_ranks_per_run: int = Field(
        4096, ge=1, description="Ranks one run may have; records of further new ranks are "
        "rejected alone (422). A multi-node run's leader holds every rank of the run: about "
        "35-40 KiB each there (a 1024-rank run, 128 nodes x 8, adds 36 MB: "
        "bench/leader_load.py); 4096 ranks, a 512-node job, about 160 MiB, brought in "
        "max_new_ranks_per_request at a time.",
    )
    ended_run_ttl_seconds: float = Field(
        900.0, ge=0, description="An ended run leaves /metrics and memory after this long."
    )
    silent_run_ttl_seconds: float = Field(
        6 * 3600.0, ge=0, description="A run with no record for this long leaves /metrics."
    )
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="A request's headers must arrive within this (slowloris)."
    )
    request_timeout_seconds: float = Field(
        60.0, gt=0, description="A request's body must arrive within this after its headers."
    )
    max_connections: int = Field(
        500, ge=8, description="Open connections, in any state; one more closes the one "
        "stalled longest on a client that does not read, else the oldest still sending its "
        "request. Keep it well under the process's file-descriptor limit.",
    )
    write_timeout_seconds: float = Field(
        30.0, gt=0, description="An answer the client stops reading is dropped (and the "
        "connection closed) once its writes have waited this long.",
    )
    max_read_streams: int = Field(
        4, ge=1, le=64, description="Large read answers (records, findings) produced at "
        "once; one more is answered 503. Each holds at most one chunk.",
    )
    read_page_bytes: int = Field(
        16 * MiB, ge=64 * 1024, description="Stored bytes one page of records or findings "
        "may carry; a longer answer ends with a `next` link.",
    )
    tick_interval_seconds: float = Field(1.0, gt=0, le=60)
    failpoint: str | None = Field(
        None, description="Crash tests only: the name of a commit boundary "
        "(pipeline/failpoints.py) at which the process kills itself with SIGKILL, to prove "
        "that a restart recovers from a crash there. Never set it in production.",
    )
    snapshot_interval_seconds: float = Field(
        10.0, gt=0, description="How often detector state is persisted (restart recovery)."
    )
    snapshot_every_steps: int = Field(
        64, ge=1, description="A run's detector state is also persisted each time its "
        "latest step moved this far since the last time, and as often while it is rebuilt "
        "for a resume: a resume to any step finds a snapshot about this far below it and "
        "replays only the records since (pipeline/registry.py).",
    )

    detectors: DetectorSettings = Field(default_factory=DetectorSettings)
    alerting: AlertingSettings = Field(default_factory=AlertingSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags beat env, env beats the YAML file, the file beats defaults.
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls))

    @model_validator(mode="after")
    def _token_sources(self) -> Settings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set either token or token_file, not both")
        if self.token is not None and not self.token.get_secret_value():
            # An empty MONITOR_AGENT_TOKEN is how compose and .env say "no token".
            self.token = None
        if self.cluster.peer_token is not None and self.cluster.peer_token_file is not None:
            raise ValueError("cluster: set either peer_token or peer_token_file, not both")
        try:
            self.token_value()  # refuse to start on a token that cannot be the one meant
            self.peer_token_value()
        except TokenError as exc:
            raise ValueError(str(exc)) from None
        return self

    def token_value(self) -> str | None:
        """The bearer token now, or None when none is configured.

        The one place the token is read: ``token_file`` is read on every call, so a rotated
        file applies at once. A configured token never turns auth off by itself: a blank
        ``token``, or a ``token_file`` that is missing, unreadable, empty or only whitespace,
        raises TokenError (startup refuses to start; requests fail closed with 503).
        """
        if self.token is not None:
            value = self.token.get_secret_value()
            if not value.strip():
                raise TokenError("token: is only whitespace; set a real token or unset it")
            return value
        if self.token_file is None:
            return None
        try:
            text = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise TokenError(f"token_file: cannot read {self.token_file}: {why}") from None
        if not text:
            raise TokenError(f"token_file: {self.token_file} is empty or only whitespace")
        return text

    def peer_token_value(self) -> str | None:
        """The leader link's credential now (``cluster.peer_token``): what a node sidecar
        sends its run's leader and what ``POST /v1/peer/digests`` requires; None when no
        token of any kind is configured (then every door is open). Unset, it is derived
        from the write token (HMAC-SHA256 of a fixed label): the write token itself never
        leaves this sidecar. TokenError as ``token_value``."""
        cluster = self.cluster
        if cluster.peer_token is not None:
            value = cluster.peer_token.get_secret_value().strip()
            if not value:
                raise TokenError("cluster.peer_token: is empty; set a real one or unset it")
            return value
        if cluster.peer_token_file is not None:
            try:
                text = cluster.peer_token_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise TokenError(f"cluster.peer_token_file: cannot read "
                                 f"{cluster.peer_token_file}: {why}") from None
            if not text:
                raise TokenError(f"cluster.peer_token_file: {cluster.peer_token_file} is "
                                 "empty or only whitespace")
            return text
        token = self.token_value()
        if token is None:
            return None
        return hmac.new(token.encode(), PEER_LABEL, hashlib.sha256).hexdigest()

    @property
    def db_path(self) -> Path:
        return self.data_dir / "monitor.sqlite"

    @property
    def alerts_db_path(self) -> Path:
        return self.data_dir / "alerts.sqlite"

    def redacted(self) -> dict[str, Any]:
        """The settings as JSON-able data with every secret shown as '**********'."""
        return self.model_dump(mode="json")


class ConfigError(MonitorAgentError, ValueError):
    """A configuration problem, worded for the person fixing the file."""


class TokenError(ConfigError):
    """The configured bearer token cannot be read now (so nothing it guards may pass)."""


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Build Settings from an optional YAML file, the environment and explicit overrides."""
    if config_file is not None and not Path(config_file).is_file():
        raise ConfigError(f"config file {config_file} does not exist")
    if config_file is not None:
        _check_yaml_file(Path(config_file))
    overrides = {k: v for k, v in overrides.items() if v is not None}

    class _FromFile(Settings):
        model_config = SettingsConfigDict(yaml_file=config_file)

    try:
        return _FromFile(**overrides)
    except ValidationError as exc:
        raise ConfigError(explain_config_error(exc, config_file)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(exc, config_file)) from None


def _check_yaml_file(path: Path) -> None:
    """Fail in one line, naming the place, on what the settings loader would trace back on."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(exc, path)) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}:1:1: expected a mapping of settings (key: value) at the top "
                          f"level, got a {type(data).__name__}")


def explain_config_error(exc: ValidationError, source: Path | str | None) -> str:
    where = f" in {source}" if source else ""
    lines = [f"invalid configuration{where}:"]
    for err in exc.errors(include_url=False):
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting (check the spelling; see docs/reference/configuration.md)"
        lines.append(f"  {field}: {msg}")
    return "\n".join(lines)
