"""docs/openapi.yaml names exactly the operations a worker serves, and requests generated from it
(hypothesis: valid, invalid and hostile values for every parameter and body) never get a 500 from
a real worker process, always get a spec error body when refused, and change nothing persisted
when refused."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.workers.worker_process import start_worker
from workers.config import WorkerConfig
from workers.embedded.services import free_port
from workers.harness.cluster import LOOPBACK
from workers.http.accounts import AccountSettings
from workers.http.client_api import ApiDeps, ClientApi

SPEC = yaml.safe_load((Path(__file__).resolve().parents[3] / "docs" / "openapi.yaml").read_text())
#: Not fuzzed: they end the session the fuzzing uses (tested in test_accounts).
SKIP = {("post", "/_matrix/client/v3/logout"), ("post", "/_matrix/client/v3/logout/all")}


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, item in SPEC["paths"].items()
        for method, op in item.items()
        if (method, path) not in SKIP
    ]


def test_the_description_and_the_routes_name_the_same_operations() -> None:
    accounts = AccountSettings("localhost", "open", None)
    deps = ApiDeps(None, accounts, None, None, None, None, lambda: (True, {}), lambda: True)  # type: ignore[arg-type]
    # The stored streams' routes are served when their handlers exist (routes only keep them).
    deps.account_data = deps.device_lists = deps.to_device = object()  # type: ignore[assignment]
    app = ClientApi(deps).application()
    served = {
        (route.method.lower(), _shape(route.resource.canonical))
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
        and not route.resource.canonical.startswith(("/health", "/metrics", "/_fanout/internal"))
    }  # fmt: skip
    described = {(method, _shape(path)) for path, item in SPEC["paths"].items() for method in item}
    assert served == described, (sorted(served - described), sorted(described - served))


def _call(base: str, method: str, path: str, body: bytes | None, token: str | None) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, data=body, method=method.upper())
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw


def _value(schema: dict[str, Any], ctx: dict[str, str]) -> st.SearchStrategy[Any]:
    """Values for a parameter or body field: mostly what the schema says (with real ids where it
    names an id), sometimes anything at all."""
    kind, fmt = schema.get("type"), schema.get("format")
    hostile = st.one_of(
        st.text(max_size=40), st.integers(), st.none(), st.booleans(), st.just("\x00"), st.just("x" * 300),
        st.lists(st.integers(), max_size=3),
    )  # fmt: skip
    if "enum" in schema:
        good: st.SearchStrategy[Any] = st.sampled_from(schema["enum"])
    elif fmt == "room_id":
        good = st.sampled_from([ctx["room"], "!nosuch:localhost", "#lobby:localhost"])
    elif fmt == "user_id":
        good = st.sampled_from([ctx["user"], "@nobody:localhost", "@x:remote.test"])
    elif kind == "integer":
        good = st.integers(-5, 2000)
    elif kind == "boolean":
        good = st.booleans()
    elif kind == "array":
        good = st.lists(_value(schema.get("items", {}), ctx), max_size=3)
    elif kind == "object":
        good = _object(schema, ctx)
    else:
        good = st.text(max_size=30)
    return st.one_of(good, good, good, hostile)


def _object(schema: dict[str, Any], ctx: dict[str, str]) -> st.SearchStrategy[dict[str, Any]]:
    if "$ref" in schema:
        schema = _resolve(schema)
    fields = {name: _value(_resolve(sub), ctx) for name, sub in schema.get("properties", {}).items()}
    return (
        st.fixed_dictionaries({}, optional=fields)
        if fields
        else st.dictionaries(st.text(max_size=8), st.integers(), max_size=3)
    )


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node: Any = SPEC
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return dict(node)


@st.composite
def _request(draw: st.DrawFn, ctx: dict[str, str]) -> tuple[str, str, bytes | None, str | None]:
    method, path, op = draw(st.sampled_from(_operations()))
    query: dict[str, str] = {}
    for parameter in (_resolve(p) for p in op.get("parameters", [])):
        value = draw(_value(parameter.get("schema", {}), ctx))
        text = value if isinstance(value, str) else json.dumps(value)
        if parameter["in"] == "path":
            path = path.replace("{" + parameter["name"] + "}", quote(text, safe="") or "x")
        elif draw(st.booleans()):
            query[parameter["name"]] = text
    if query:
        path += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    body: bytes | None = None
    schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if schema is not None or method in ("post", "put"):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            body = draw(st.binary(max_size=60))  # not JSON at all
        elif choice == 1:
            body = json.dumps(draw(st.lists(st.integers(), max_size=3))).encode()  # JSON, not an object
        else:
            body = json.dumps(draw(_object(schema or {}, ctx))).encode()
    token = draw(st.sampled_from([ctx["token"]] * 8 + [None, "nope"]))
    return method, path, body, token


def test_generated_requests_never_get_a_500_and_refusals_change_nothing(
    database_url: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    config = WorkerConfig(
        instance_name="fuzz1", database_url=database_url, redis_url=redis_url, channel_prefix=channel_prefix,
        stream_writers={"events": ["fuzz1"]}, http_port=port, position_announce_interval_s=0.2,
        registration_shared_secret="fuzz-registration-secret-0123", registration="open",
        rc_exempt_addresses=LOOPBACK,
    ).model_dump(mode="json", exclude_none=True)  # fmt: skip
    process: subprocess.Popen[str] = start_worker(config, tmp_path / "fuzz1.yaml")
    base = f"http://127.0.0.1:{port}"
    try:
        registration = {"username": "fuzzer", "password": "pw", "auth": {"type": "m.login.dummy"}}
        status, account = _call(
            base, "post", "/_matrix/client/v3/register", json.dumps(registration).encode(), None
        )
        assert status == 200, account
        token = account["access_token"]
        create = json.dumps({"preset": "public_chat", "room_alias_name": "lobby"}).encode()
        status, room = _call(base, "post", "/_matrix/client/v3/createRoom", create, token)
        ctx = {"token": token, "room": room["room_id"], "user": account["user_id"]}

        def persisted() -> int:
            async def count() -> int:
                conn = await asyncpg.connect(database_url)
                try:
                    return int(await conn.fetchval("SELECT count(*) FROM events") or 0)
                finally:
                    await conn.close()

            import asyncio

            return asyncio.run(count())

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(_request(ctx))
        def one(case: tuple[str, str, bytes | None, str | None]) -> None:
            method, path, body, auth = case
            before = persisted()
            status, answer = _call(base, method, path, body, auth)
            assert status < 500, (method, path, body, status, answer)
            if status == 401 and isinstance(answer, dict) and "flows" in answer:
                return  # the user-interactive auth step of /register: the spec's answer, no errcode
            if status >= 400:
                assert isinstance(answer, dict) and str(answer.get("errcode", "")).startswith("M_"), answer
                assert isinstance(answer.get("error"), str)
                assert persisted() == before, (method, path, "refused, yet something was persisted")

        one()
        assert process.poll() is None, "the worker died"
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert "Traceback" not in err, err[-3000:]
