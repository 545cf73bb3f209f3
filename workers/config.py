"""A worker's configuration: one YAML file, overridden field by field by FANOUT_* variables.

`load_config(path)` is the only way in. Any problem (unreadable file, bad YAML, unknown or
missing field, wrong type or value) raises `ConfigError` whose message names the file, each bad
field and what is wrong with it; the CLI prints that message and exits with status 2.

Over 500 lines: one field per setting, each with the description the generated reference
(docs/configuration.md, `fanout config-reference`) prints, and its validators beside it; split,
the model would scatter the one reference of what a worker takes.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from workers.errors import WorkerError
from workers.model import DEFAULT_ROOM_VERSION, SUPPORTED_ROOM_VERSIONS
from workers.streams.account_data import ACCOUNT_DATA
from workers.streams.caches import CACHES
from workers.streams.device_lists import DEVICE_LISTS
from workers.streams.events import BACKFILL, EVENTS
from workers.streams.receipts import RECEIPTS
from workers.streams.to_device import TO_DEVICE

#: The stored streams: written by the events writers unless they have a list of their own.
STORED_STREAMS = (ACCOUNT_DATA, DEVICE_LISTS, TO_DEVICE, RECEIPTS)

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
ENV_PREFIX = "FANOUT_"


class ConfigError(WorkerError):
    """The configuration cannot be used; str(error) is a complete message for a person."""


class RateLimit(BaseModel):
    """One rate limit as Synapse writes it: a sustained rate and the burst allowed above it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_second: float = Field(gt=0, description="Actions per second, sustained")
    burst_count: int = Field(ge=1, description="Actions allowed at once after a quiet spell")


_SYNAPSE_LOGIN_LIMIT = RateLimit(per_second=0.17, burst_count=3)


class LoginRateLimits(BaseModel):
    """Synapse's rc_login: per client address, per account tried, and per account's wrong passwords."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: RateLimit | None = Field(default_factory=lambda: _SYNAPSE_LOGIN_LIMIT)
    account: RateLimit | None = Field(default_factory=lambda: _SYNAPSE_LOGIN_LIMIT)
    failed_attempts: RateLimit | None = Field(default_factory=lambda: _SYNAPSE_LOGIN_LIMIT)


def checked_url(value: str, schemes: tuple[str, ...]) -> str:
    """`value` unchanged if it is a URL of one of `schemes` whose parts a client can use: a port
    in 1-65535 when one is given, a host for http(s), a database number for redis(s); else a
    ValueError saying which part is wrong (the settings model turns it into a named field)."""
    scheme, sep, _ = value.partition("://")
    if not sep or scheme not in schemes:
        raise ValueError("must start with " + " or ".join(f"{s}://" for s in schemes))
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:  # bad IPv6 brackets, a port that is no number or above 65535
        if "Port" not in str(e):
            raise ValueError(f"malformed URL: {e}") from None
        port = -1
    if port is not None and not 1 <= port <= 65535:
        given = parts.netloc.rpartition("@")[2].rpartition("]")[2].rpartition(":")[2]
        raise ValueError(f"malformed URL: port {given!r} is not a number in 1-65535")
    if scheme in ("http", "https") and not parts.hostname:
        raise ValueError(f"malformed URL: {value!r} names no host")
    if scheme in ("redis", "rediss") and not re.fullmatch(r"/?[0-9]{0,5}", parts.path):
        raise ValueError(f"malformed URL: the path {parts.path!r} is not a database number (/0)")
    return value


class WorkerConfig(BaseSettings):
    """Everything one worker process needs to know. Defaults suit a single machine."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    instance_name: str = Field(
        description="Stable name of this worker, unique in the cluster; `{hostname}` in it is replaced"
        " by $HOSTNAME (else the host's name), so replicas of one container config get distinct names"
    )
    database_url: str = Field(description="postgresql://user[:password]@host:port/database")
    database_pooler: Literal["none", "transaction"] = Field(
        "none",
        description="What database_url reaches: PostgreSQL itself (none), or PgBouncer with"
        " pool_mode = transaction (asyncpg's prepared-statement cache off; what needs a session uses"
        " database_direct_url). See operations.md, Capacity",
    )
    database_direct_url: str | None = Field(
        None,
        description="With database_pooler: transaction, PostgreSQL itself (not the pooler), for what"
        " needs one session: the schema migration lock and the instance-name lease. Required then,"
        " refused otherwise",
    )
    redis_url: str = Field(
        description="redis://, rediss:// (TLS) or unix://; user:password@ for ACLs. With"
        " redis_cluster it defaults to that list's first node (which the start-up check PINGs)"
    )
    redis_cluster: list[str] = Field(
        default_factory=list,
        description="A Redis Cluster instead of one server: redis:// or rediss:// URLs of some of its"
        " nodes (the others are discovered). Channels then go to the shard owning them and the"
        " worker follows slot migrations and failovers; with sharded_pubsub, set"
        " per_stream_channels too",
    )
    server_name: str = Field(
        "localhost",
        pattern=r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$",
        description="The Matrix server name: user ids are @name:<server_name>, room ids !id:<server_name>",
    )
    registration: Literal["closed", "open", "token"] = Field(
        "closed",
        description="Who may create an account with POST /register: closed (nobody; the shared-secret"
        " admin registration still works), open (anyone, m.login.dummy) or token (whoever holds a"
        " registration token, m.login.registration_token; tokens are made with"
        " /_synapse/admin/v1/registration_tokens or `fanout registration-token`)",
    )
    registration_shared_secret: str | None = Field(
        None,
        min_length=16,
        repr=False,
        description="Secret of POST /_synapse/admin/v1/register (HMAC-SHA1, as Synapse's);"
        " unset: that endpoint is off",
    )
    rc_message: RateLimit | None = Field(
        {"per_second": 0.2, "burst_count": 10},
        validate_default=True,
        description="Rate limit of sending events (PUT .../send, .../state), per user and per client"
        " address, shared by every worker; {per_second, burst_count} as Synapse's rc_*; null: none",
    )
    rc_registration: RateLimit | None = Field(
        {"per_second": 0.17, "burst_count": 3},
        validate_default=True,
        description="Rate limit of POST /register (and the token validity check) per client address",
    )
    rc_login: LoginRateLimits = Field(
        {name: {"per_second": 0.17, "burst_count": 3} for name in ("address", "account", "failed_attempts")},
        validate_default=True,
        description="Rate limits of POST /login: {address, account, failed_attempts}, each"
        " {per_second, burst_count} or null (default 0.17/s, burst 3 each, as Synapse's);"
        " failed_attempts counts wrong passwords per account",
    )
    rc_joins: RateLimit | None = Field(
        {"per_second": 0.1, "burst_count": 10},
        validate_default=True,
        description="Rate limit of joining a room, per user and per client address",
    )
    rc_invites: RateLimit | None = Field(
        {"per_second": 0.3, "burst_count": 10},
        validate_default=True,
        description="Rate limit of sending invites, per inviting user and per client address",
    )
    rc_room_creation: RateLimit | None = Field(
        {"per_second": 0.05, "burst_count": 10},
        validate_default=True,
        description="Rate limit of POST /createRoom, per user and per client address",
    )
    rc_exempt_addresses: list[str] = Field(
        default_factory=list,
        description="Client addresses or networks (CIDR) no rate limit applies to (bridges, the"
        " load generator of a test)",
    )
    rc_exempt_admins: bool = Field(True, description="Server admins are not rate limited")
    x_forwarded: bool = Field(
        False,
        description="The client address is the last X-Forwarded-For entry (set it behind a load"
        " balancer that adds the header, or every client shares the balancer's address); off: the"
        " TCP peer",
    )
    db_slow_transaction_s: float = Field(
        1.0,
        gt=0,
        description="A database transaction held longer than this many seconds is logged (its name"
        " and duration) and counted in fanout_db_slow_transactions_total{name}; every one is timed"
        " in fanout_db_transaction_seconds{name}",
    )

    channel_prefix: str = Field("fanout", description="Pub/sub channel (and key) prefix of this cluster")
    stream_writers: dict[str, list[str]] = Field(
        default_factory=dict, description="stream name -> instance names allowed to write it"
    )
    per_stream_channels: bool = Field(False, description="Publish each stream on <prefix>/<stream>")
    sharded_pubsub: bool = Field(False, description="Use SPUBLISH/SSUBSCRIBE (Redis >= 7, Redis Cluster)")
    publish_replies: bool = Field(
        False,
        description="Read a reply to every PUBLISH and hint-key write on one server (default: none,"
        " CLIENT REPLY OFF; set true behind a proxy that refuses CLIENT REPLY). A Redis Cluster's are"
        " always read",
    )
    http_host: str = Field("127.0.0.1", description="Address the HTTP API listens on")
    http_port: int = Field(8080, ge=0, le=65535, description="0 picks a free port")
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="A separate listener for /metrics and /health/* (none: the API port only)",
    )
    http_max_line_bytes: int = Field(
        8190, ge=1024, le=1 << 20, description="Longest HTTP request line (400 above)"
    )
    http_max_header_bytes: int = Field(
        8190, ge=1024, le=1 << 20, description="Longest HTTP header (400 above)"
    )
    position_announce_interval_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="Seconds between a writer's announcement ticks: a stream that moved (or sent rows)"
        " since its last POSITION announces it at the next tick; an idle stream repeats it every"
        " silent_writer_intervals // 2 ticks",
    )
    silent_writer_intervals: int = Field(
        5,
        ge=2,
        description="Announce intervals before a writer is 'silent' (an idle writer announces at least"
        " twice within)",
    )
    max_line_bytes: int = Field(1 << 20, ge=1024, description="Longest accepted pub/sub line")
    catch_up_batch_size: int = Field(
        1000, ge=1, le=100_000, description="Rows read per query when catching up from the database"
    )
    db_pool_size: int = Field(
        10,
        ge=1,
        le=200,
        description="Connections in the worker's Postgres pool; the worker opens at most this plus one"
        " (its instance-name lease): budget them against max_connections, or with database_pooler"
        " against PgBouncer's max_client_conn (operations.md, Capacity)",
    )
    persist_batches_in_flight: int = Field(
        2,
        ge=1,
        le=16,
        description="Batches a persister has in the database at once (each holds a"
        " pool connection while it inserts)",
    )
    serve_reads: bool = Field(
        True,
        description="Serve /sync and room state, applying every writer's rows; false for a"
        " persister that only writes (it then applies only the caches stream's rows, for its token"
        " cache, follows the other streams' positions, and relays reads to a worker that serves them)",
    )
    read_workers: list[str] = Field(
        default_factory=list,
        description="With serve_reads false: the instance_map names to relay /sync and the other"
        " reads to (a client's token keeps to one of them); empty: every other instance_map entry,"
        " skipping those that serve no reads",
    )
    default_room_version: str = Field(
        DEFAULT_ROOM_VERSION,
        description="Room version of createRoom when the request names none"
        f" ({', '.join(SUPPORTED_ROOM_VERSIONS)})",
    )
    background_tasks: list[Literal["room_stats", "prune_invalidations", "federation_sender"]] = Field(
        default_factory=list, description="Background tasks this instance runs"
    )
    invalidation_retention_days: int = Field(
        30, ge=1, description="Days of the invalidation log kept by the prune_invalidations background task"
    )
    cache_max_entries: int = Field(10_000, ge=1, description="Entries per in-process cache (LRU)")
    access_token_cache_entries: int = Field(
        100_000,
        ge=1,
        description="Access tokens a worker keeps in memory (LRU, about 320 bytes each); a token"
        " beyond them costs a database read per request",
    )
    startup_retry_s: float = Field(
        30.0, ge=0, le=3600, description="Seconds to retry Postgres and Redis at start-up before exiting 1"
    )
    instance_lease_s: float = Field(
        10.0,
        ge=1,
        le=600,
        description="Seconds a frozen, crashed or cut-off process keeps its instance name (and its rooms)"
        " before another process may take them; the holder renews it every third of this",
    )
    shutdown_timeout_s: float = Field(
        20.0,
        ge=1,
        le=600,
        description="Seconds from SIGTERM to exit at the most: each shutdown step is bounded, a step"
        " past the bound is skipped (named in one log line, exit code 1); keep it below the"
        " orchestrator's grace period (30 s by default)",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text on stderr, or one JSON object a line on stdout (containers)"
    )
    instance_map: dict[str, str] = Field(
        default_factory=dict,
        description="instance name -> base URL of its HTTP listener (http://host:port): where worker"
        " requests to the owner of a stream or duty go",
    )
    remote_servers: dict[str, str] = Field(
        default_factory=dict,
        description="server name -> base URL of its federation API: where the device-list writer"
        " fetches a remote user's devices (a stand-in for federation's server discovery)",
    )
    worker_secret: str | None = Field(
        None,
        min_length=16,
        repr=False,
        description="Shared secret of worker-to-worker requests (/_fanout/internal/...); unset: this"
        " worker refuses them all and cannot forward any",
    )
    worker_request_timeout_s: float = Field(
        5.0, gt=0, le=120, description="Seconds one worker request may take, retries included"
    )
    writer_wait_s: float = Field(
        10.0,
        ge=0,
        le=120,
        description="Seconds a write keeps trying while its writer stops, restarts or hands the room"
        " to another persister (refused unprocessed, unreachable, room moving) before answering 503",
    )
    presence_process_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Seconds after which the presence writer forgets the syncing users of a process"
        " it has not heard from (one killed without CLEAR_USER_SYNC)",
    )
    presence_keepalive_s: float = Field(
        60.0, gt=0, description="Seconds between a sync worker's re-sends of USER_SYNC start (its keep-alive)"
    )
    presence_offline_grace_s: float = Field(
        30.0, ge=0, description="Seconds a user stays online after their last sync ended"
    )
    user_sync_end_delay_s: float = Field(
        10.0, ge=0, description="Seconds without a new sync before USER_SYNC end is sent (debounce)"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Logging threshold")
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="uvloop (asyncio's own loop when uvloop is not installed) or asyncio"
    )

    @field_validator("instance_name", mode="before")
    @classmethod
    def _hostname(cls, value: Any) -> Any:
        if isinstance(value, str) and "{hostname}" in value:
            host = os.environ.get("HOSTNAME") or socket.gethostname()
            return value.replace("{hostname}", re.sub(r"[^A-Za-z0-9_.\-]", "-", host))
        return value

    @field_validator("instance_name", "channel_prefix")
    @classmethod
    def _simple_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("use only letters, digits, '_', '.' and '-' (it appears in wire lines)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _renamed_registration(cls, data: Any) -> Any:
        if isinstance(data, dict) and "enable_registration" in data:
            raise ValueError(
                "enable_registration was replaced by registration: closed | open | token"
                " (enable_registration: true is registration: open; false is registration: closed)"
            )
        return data

    @field_validator("rc_exempt_addresses")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an address or a network (CIDR)") from None
        return value

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        return None if value is None else checked_url(value, ("postgresql", "postgres"))

    @model_validator(mode="after")
    def _pooler_urls(self) -> WorkerConfig:
        direct = self.database_direct_url
        if self.database_pooler == "transaction" and direct is None:
            raise ValueError(
                "database_pooler: transaction needs database_direct_url (PostgreSQL itself, not"
                " PgBouncer) for the schema migration lock and the instance-name lease"
            )
        if self.database_pooler == "none" and direct is not None:
            raise ValueError(
                "database_direct_url is used only with database_pooler: transaction; remove it, or"
                " set database_pooler when database_url is a PgBouncer in transaction mode"
            )
        if direct is not None and direct == self.database_url:
            raise ValueError(
                "database_direct_url equals database_url: with database_pooler: transaction,"
                " database_url is PgBouncer and database_direct_url PostgreSQL itself"
            )
        return self

    @property
    def session_database_url(self) -> str:
        """Where a connection that keeps session state (advisory locks, session settings) goes:
        PostgreSQL itself, never through a transaction pooler."""
        return self.database_direct_url or self.database_url

    @field_validator("default_room_version")
    @classmethod
    def _room_version(cls, value: str) -> str:
        if value not in SUPPORTED_ROOM_VERSIONS:
            raise ValueError(f"must be one of {', '.join(SUPPORTED_ROOM_VERSIONS)}")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        return checked_url(value, ("redis", "rediss", "unix"))

    @field_validator("redis_cluster")
    @classmethod
    def _cluster_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("redis://", "rediss://")):
                raise ValueError(
                    f"{url!r} must start with redis:// or rediss:// (a cluster has no unix sockets)"
                )
            try:
                checked_url(url, ("redis", "rediss"))
            except ValueError as e:
                raise ValueError(f"{url!r} is malformed: {e}") from None
            if urlsplit(url).path not in ("", "/", "/0"):
                raise ValueError(f"{url!r}: a Redis Cluster has database 0 only")
        return value

    @model_validator(mode="before")
    @classmethod
    def _redis_url_from_cluster(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("redis_url"):
            nodes = data.get("redis_cluster")
            if isinstance(nodes, list) and nodes and isinstance(nodes[0], str):
                return {**data, "redis_url": nodes[0]}
        return data

    @model_validator(mode="after")
    def _cluster_channels(self) -> WorkerConfig:
        if self.redis_cluster and self.sharded_pubsub and not self.per_stream_channels:
            raise ValueError(
                "sharded_pubsub on a redis_cluster needs per_stream_channels: true, or every stream"
                " shares the base channel's shard"
            )
        return self

    @field_validator("stream_writers")
    @classmethod
    def _writer_names(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for stream, writers in value.items():
            for name in [stream, *writers]:
                if not _NAME.match(name):
                    raise ValueError(f"{name!r} is not a valid stream or instance name")
            if len(set(writers)) != len(writers):
                raise ValueError(f"stream {stream!r} lists a writer twice")
        return value

    @field_validator("instance_map")
    @classmethod
    def _instance_urls(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if not _NAME.match(name):
                raise ValueError(f"{name!r} is not a valid instance name")
            try:
                checked_url(url, ("http", "https"))
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        return {name: url.rstrip("/") for name, url in value.items()}

    @model_validator(mode="after")
    def _read_workers_known(self) -> WorkerConfig:
        unknown = [name for name in self.read_workers if name not in self.instance_map]
        if unknown:
            raise ValueError(f"read_workers {unknown} have no URL in instance_map")
        return self

    @field_validator("remote_servers")
    @classmethod
    def _remote_urls(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            try:
                checked_url(url, ("http", "https"))
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        return value

    def configured_writers(self, stream: str) -> list[str]:
        """The writers `stream_writers` lists for `stream`, as written (empty: none listed); the
        worker runs with `writers_of`."""
        return list(self.stream_writers.get(stream, []))

    def writers_of(self, stream: str) -> list[str]:
        """Who writes `stream`, the one rule start-up and reload share: backfill is written by the
        events writers; the caches stream by its own writers (else the events writers) and by
        every device_lists writer (it records the access tokens it ends there); a stored stream
        without a list of its own by the events writers; any other stream by its list alone."""
        listed = self.configured_writers
        if stream == BACKFILL:
            return listed(EVENTS)
        if stream == CACHES:
            own = listed(CACHES) or listed(EVENTS)
            return own + [w for w in self.writers_of(DEVICE_LISTS) if w not in own]
        if stream in STORED_STREAMS:
            return listed(stream) or listed(EVENTS)
        return listed(stream)

    def writes(self, stream: str) -> bool:
        """Whether this instance writes `stream` (`writers_of`)."""
        return self.instance_name in self.writers_of(stream)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # FANOUT_* variables override the file, which is passed in as init values.
        return (env_settings, init_settings)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ENV_FIELD = re.compile(r'field "([^"]+)" from source "EnvSettingsSource"')


def _format_validation_error(source: str, error: ValidationError) -> str:
    lines = [f"invalid configuration in {source}:"]
    if error.error_count() == 1:  # one problem: one line, as the start-up failure table shows it
        lines[0] += " " + _describe_item(error.errors()[0])
        return lines[0]
    lines += [f"  {_describe_item(item)}" for item in error.errors()]
    return "\n".join(lines)


def _describe_item(item: Any) -> str:
    field = ".".join(str(part) for part in item["loc"]) or "(top level)"
    message = item["msg"]
    if item["type"] == "extra_forbidden":
        message = "unknown field (check the spelling)"
    return f"field '{field}': {message}"


def load_config(path: str | Path | None, **overrides: Any) -> WorkerConfig:
    """Read `path` (YAML mapping; None means environment only), apply FANOUT_* and `overrides`."""
    data: dict[str, Any] = {}
    source = str(path) if path is not None else "the environment"
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read configuration file {path}: {e.strerror}") from None
        try:
            loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
        except ConfigError as e:
            raise ConfigError(f"configuration file {path}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"configuration file {path} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"configuration file {path} must hold a mapping of field: value")
        data = loaded
    data.update(overrides)
    try:
        return WorkerConfig(**data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(source, e)) from None
    except SettingsError as e:
        found = _ENV_FIELD.search(str(e))
        variable = ENV_PREFIX + found.group(1).upper() if found else "a FANOUT_* variable"
        raise ConfigError(
            f"environment variable {variable} is malformed (a list or mapping is JSON)"
        ) from None


def env_overrides() -> dict[str, str]:
    """The FANOUT_* variables in effect (for start-up logs)."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
