"""Accounts over the Matrix API: the register flow, login, devices, logout everywhere at once,
and Synapse's shared-secret registration."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import aiohttp

from tests.workers.conftest import MakeWorker

C = "/_matrix/client/v3"
SECRET = "registration-secret-0123456789"


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_register_login_whoami_logout(make_worker: MakeWorker, http: aiohttp.ClientSession) -> None:
    worker = await make_worker("p1", ["p1"])
    reader = await make_worker("r1", ["p1"])
    base, other = (f"http://127.0.0.1:{w.http_port}" for w in (worker, reader))
    status, body = await call(http, "GET", f"{base}/_matrix/client/versions")
    assert status == 200 and "v1.11" in body["versions"]
    # The spec's user-interactive auth: a first try without `auth` is told the flows.
    status, flows = await call(http, "POST", f"{base}{C}/register", {"username": "alice", "password": "pw1"})
    assert status == 401 and flows["flows"] == [{"stages": ["m.login.dummy"]}] and flows["session"]
    auth = {"type": "m.login.dummy", "session": flows["session"]}
    register = {"username": "alice", "password": "pw1", "auth": auth, "initial_device_display_name": "laptop"}
    status, account = await call(http, "POST", f"{base}{C}/register", register)
    assert status == 200 and account["user_id"] == "@alice:localhost"
    assert account["access_token"] and account["device_id"]
    status, available = await call(http, "GET", f"{base}{C}/register/available?username=alice")
    assert (status, available["errcode"]) == (400, "M_USER_IN_USE")
    assert await call(http, "GET", f"{base}{C}/register/available?username=bob") == (200, {"available": True})

    status, flows = await call(http, "GET", f"{other}{C}/login")
    assert flows == {"flows": [{"type": "m.login.password"}]}
    login = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "@alice:localhost"},
             "password": "pw1", "device_id": "PHONE"}  # fmt: skip
    status, session = await call(http, "POST", f"{other}{C}/login", login)
    assert status == 200 and session["device_id"] == "PHONE" and session["user_id"] == "@alice:localhost"
    status, me = await call(http, "GET", f"{base}{C}/account/whoami", token=session["access_token"])
    assert me == {"user_id": "@alice:localhost", "device_id": "PHONE", "is_guest": False}
    # The deprecated `user` field still logs in.
    status, _ = await call(
        http, "POST", f"{base}{C}/login", {"type": "m.login.password", "user": "alice", "password": "pw1"}
    )
    assert status == 200
    # Logged out on one worker: the token is dead on every worker at once.
    assert await call(http, "POST", f"{other}{C}/logout", {}, token=session["access_token"]) == (200, {})
    for url in (base, other):
        status, body = await call(http, "GET", f"{url}{C}/account/whoami", token=session["access_token"])
        assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    status, _ = await call(http, "GET", f"{base}{C}/account/whoami", token=account["access_token"])
    assert status == 200
    assert await call(http, "POST", f"{base}{C}/logout/all", {}, token=account["access_token"]) == (200, {})
    status, _ = await call(http, "GET", f"{base}{C}/account/whoami", token=account["access_token"])
    assert status == 401
    async with worker.pool.acquire() as conn:
        stored = await conn.fetchval("SELECT password_hash FROM users WHERE user_id = '@alice:localhost'")
    assert stored.startswith("$argon2id$") and "pw1" not in stored


async def test_closed_registration_and_shared_secret_registration(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"], registration="closed", registration_shared_secret=SECRET)
    reader = await make_worker("r1", ["p1"], registration="closed", registration_shared_secret=SECRET)
    base, other = (f"http://127.0.0.1:{w.http_port}" for w in (worker, reader))
    status, body = await call(http, "POST", f"{base}{C}/register", {"auth": {"type": "m.login.dummy"}})
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")

    def mac(nonce: str, user: str, password: str, admin: bool) -> str:
        digest = hmac.new(SECRET.encode(), digestmod=hashlib.sha1)
        digest.update(f"{nonce}\0{user}\0{password}\0".encode() + (b"admin" if admin else b"notadmin"))
        return digest.hexdigest()

    # The nonce from one worker is good on another, once.
    status, nonce = await call(http, "GET", f"{base}/_synapse/admin/v1/register")
    request = {"nonce": nonce["nonce"], "username": "root", "password": "pw", "admin": True,
               "mac": mac(nonce["nonce"], "root", "pw", True)}  # fmt: skip
    status, account = await call(http, "POST", f"{other}/_synapse/admin/v1/register", request)
    assert status == 200 and account["user_id"] == "@root:localhost" and account["access_token"]
    status, again = await call(http, "POST", f"{other}/_synapse/admin/v1/register", request)
    assert (status, again["errcode"]) == (400, "M_UNKNOWN")
    status, nonce = await call(http, "GET", f"{base}/_synapse/admin/v1/register")
    forged = {
        **request,
        "nonce": nonce["nonce"],
        "username": "eve",
        "mac": mac(nonce["nonce"], "root", "pw", True),
    }
    status, refused = await call(http, "POST", f"{base}/_synapse/admin/v1/register", forged)
    assert (status, refused["errcode"]) == (403, "M_FORBIDDEN")
    login = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": "root"},
        "password": "pw",
    }
    assert (await call(http, "POST", f"{base}{C}/login", login))[0] == 200


async def test_device_keys_upload_and_query_for_local_users(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    base = f"http://127.0.0.1:{worker.http_port}{C}"
    body = {"username": "alice", "password": "pw", "auth": {"type": "m.login.dummy"}, "device_id": "LAPTOP"}
    status, alice = await call(http, "POST", f"{base}/register", body)
    assert status == 200
    keys = {"user_id": "@alice:localhost", "device_id": "LAPTOP", "algorithms": ["m.olm.v1"],
            "keys": {"ed25519:LAPTOP": "abc"}, "signatures": {}}  # fmt: skip
    assert await call(http, "POST", f"{base}/keys/upload", {"device_keys": keys}, alice["access_token"]) == (
        200, {"one_time_key_counts": {}},
    )  # fmt: skip
    forged = {**keys, "user_id": "@bob:localhost"}
    status, refused = await call(
        http, "POST", f"{base}/keys/upload", {"device_keys": forged}, alice["access_token"]
    )
    assert (status, refused["errcode"]) == (400, "M_INVALID_PARAM")
    status, found = await call(
        http, "POST", f"{base}/keys/query", {"device_keys": {"@alice:localhost": []}}, alice["access_token"]
    )
    assert status == 200 and found["device_keys"]["@alice:localhost"]["LAPTOP"]["keys"] == {
        "ed25519:LAPTOP": "abc"
    }
    status, only = await call(
        http,
        "POST",
        f"{base}/keys/query",
        {"device_keys": {"@alice:localhost": ["OTHER"]}},
        alice["access_token"],
    )
    assert only["device_keys"] == {"@alice:localhost": {}}
