"""`registration: token`: the spec's m.login.registration_token stage, the validity check, uses and
expiry, and Synapse's admin API and `fanout registration-token` that manage the tokens."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import subprocess
import sys
import time
from typing import Any

import aiohttp

from tests.workers.conftest import MakeWorker
from tests.workers.http.test_accounts import SECRET, call

C = "/_matrix/client/v3"
VALIDITY = "/_matrix/client/v1/register/m.login.registration_token/validity"
TOKENS = "/_synapse/admin/v1/registration_tokens"


async def shared_secret_account(http: aiohttp.ClientSession, base: str, name: str, admin: bool) -> str:
    """An account made with the shared secret (open to scripts whatever the policy); its token."""
    _, nonce = await call(http, "GET", f"{base}/_synapse/admin/v1/register")
    digest = hmac.new(SECRET.encode(), digestmod=hashlib.sha1)
    digest.update(f"{nonce['nonce']}\0{name}\0pw\0".encode() + (b"admin" if admin else b"notadmin"))
    body = {
        "nonce": nonce["nonce"],
        "username": name,
        "password": "pw",
        "admin": admin,
        "mac": digest.hexdigest(),
    }
    status, account = await call(http, "POST", f"{base}/_synapse/admin/v1/register", body)
    assert status == 200, account
    return str(account["access_token"])


def registration(name: str, auth: dict[str, Any] | None) -> dict[str, Any]:
    return {"username": name, "password": "pw", **({"auth": auth} if auth else {})}


async def test_register_with_a_token_spends_one_use(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"], registration="token", registration_shared_secret=SECRET)
    reader = await make_worker("r1", ["p1"], registration="token", registration_shared_secret=SECRET)
    base, other = (f"http://127.0.0.1:{w.http_port}" for w in (worker, reader))
    root = await shared_secret_account(http, base, "root", admin=True)
    status, token = await call(http, "POST", f"{base}{TOKENS}/new", {"uses_allowed": 1}, root)
    assert status == 200 and len(token["token"]) == 16
    assert {k: v for k, v in token.items() if k != "token"} == {
        "uses_allowed": 1, "pending": 0, "completed": 0, "expiry_time": None
    }  # fmt: skip
    assert await call(http, "GET", f"{other}{VALIDITY}?token={token['token']}") == (200, {"valid": True})
    assert await call(http, "GET", f"{other}{VALIDITY}?token=nope") == (200, {"valid": False})

    status, flows = await call(http, "POST", f"{other}{C}/register", registration("alice", None))
    assert status == 401 and flows["flows"] == [{"stages": ["m.login.registration_token"]}]
    dummy = {"type": "m.login.dummy", "session": flows["session"]}
    status, refused = await call(http, "POST", f"{other}{C}/register", registration("alice", dummy))
    assert status == 401 and "errcode" not in refused  # not the stage offered: the flows again
    wrong = {"type": "m.login.registration_token", "token": "nope", "session": flows["session"]}
    status, refused = await call(http, "POST", f"{other}{C}/register", registration("alice", wrong))
    assert (status, refused["errcode"]) == (401, "M_UNAUTHORIZED") and refused["flows"]
    good = {**wrong, "token": token["token"]}
    status, alice = await call(http, "POST", f"{other}{C}/register", registration("alice", good))
    assert status == 200 and alice["user_id"] == "@alice:localhost" and alice["access_token"]

    status, spent = await call(http, "GET", f"{base}{TOKENS}/{token['token']}", token=root)
    assert (spent["pending"], spent["completed"]) == (0, 1)
    assert await call(http, "GET", f"{base}{VALIDITY}?token={token['token']}") == (200, {"valid": False})
    status, refused = await call(http, "POST", f"{base}{C}/register", registration("bob", good))
    assert (status, refused["errcode"]) == (401, "M_UNAUTHORIZED")

    # A registration that fails (the name is taken) gives its use back.
    status, _ = await call(http, "PUT", f"{base}{TOKENS}/{token['token']}", {"uses_allowed": 2}, root)
    status, refused = await call(http, "POST", f"{base}{C}/register", registration("alice", good))
    assert (status, refused["errcode"]) == (400, "M_USER_IN_USE")
    status, kept = await call(http, "GET", f"{base}{TOKENS}/{token['token']}", token=root)
    assert (kept["pending"], kept["completed"]) == (0, 1)
    status, _ = await call(http, "POST", f"{base}{C}/register", registration("bob", good))
    assert status == 200


async def test_tokens_race_for_the_last_use(make_worker: MakeWorker, http: aiohttp.ClientSession) -> None:
    """Two registrations at once on two workers, one use left: exactly one account is made."""
    worker = await make_worker("p1", ["p1"], registration="token", registration_shared_secret=SECRET)
    reader = await make_worker("r1", ["p1"], registration="token", registration_shared_secret=SECRET)
    base, other = (f"http://127.0.0.1:{w.http_port}" for w in (worker, reader))
    root = await shared_secret_account(http, base, "root", admin=True)
    _, token = await call(http, "POST", f"{base}{TOKENS}/new", {"token": "last-one", "uses_allowed": 1}, root)
    auth = {"type": "m.login.registration_token", "token": token["token"]}
    answers = await asyncio.gather(
        *(call(http, "POST", f"{url}{C}/register", registration(f"u{i}", auth)) for i, url in
          enumerate([base, other, base, other]))
    )  # fmt: skip
    assert sorted(status for status, _ in answers) == [200, 401, 401, 401]


async def test_admin_api_shapes_and_refusals(make_worker: MakeWorker, http: aiohttp.ClientSession) -> None:
    worker = await make_worker("p1", ["p1"], registration="token", registration_shared_secret=SECRET)
    base = f"http://127.0.0.1:{worker.http_port}"
    root = await shared_secret_account(http, base, "root", admin=True)
    user = await shared_secret_account(http, base, "user", admin=False)
    status, refused = await call(http, "GET", TOKENS.join([base, ""]), token=user)
    assert (status, refused["errcode"]) == (403, "M_FORBIDDEN")
    status, refused = await call(http, "GET", f"{base}{TOKENS}")
    assert (status, refused["errcode"]) == (401, "M_MISSING_TOKEN")

    later = int(time.time() * 1000) + 3_600_000
    status, named = await call(
        http, "POST", f"{base}{TOKENS}/new", {"token": "abc_~.-9", "expiry_time": later}, root
    )
    assert status == 200 and named["expiry_time"] == later and named["uses_allowed"] is None
    status, short = await call(http, "POST", f"{base}{TOKENS}/new", {"length": 5}, root)
    assert status == 200 and len(short["token"]) == 5
    for bad in ({"token": "abc_~.-9"}, {"token": "no spaces"}, {"token": "x" * 65}, {"length": 0},
                {"uses_allowed": -1}, {"uses_allowed": "2"}, {"expiry_time": 1}):  # fmt: skip
        status, refused = await call(http, "POST", f"{base}{TOKENS}/new", bad, root)
        assert (status, refused["errcode"]) == (400, "M_INVALID_PARAM"), bad
    status, listing = await call(http, "GET", f"{base}{TOKENS}", token=root)
    assert [t["token"] for t in listing["registration_tokens"]] == sorted([named["token"], short["token"]])
    status, _ = await call(http, "PUT", f"{base}{TOKENS}/{short['token']}", {"uses_allowed": 0}, root)
    status, invalid = await call(http, "GET", f"{base}{TOKENS}?valid=false", token=root)
    assert [t["token"] for t in invalid["registration_tokens"]] == [short["token"]]
    status, valid = await call(http, "GET", f"{base}{TOKENS}?valid=true", token=root)
    assert [t["token"] for t in valid["registration_tokens"]] == [named["token"]]
    assert await call(http, "DELETE", f"{base}{TOKENS}/{short['token']}", token=root) == (200, {})
    for method in ("GET", "DELETE", "PUT"):
        status, missing = await call(http, method, f"{base}{TOKENS}/{short['token']}", {}, root)
        assert (status, missing["errcode"]) == (404, "M_NOT_FOUND")


async def test_validity_is_refused_unless_registration_takes_tokens(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"], registration="closed")
    base = f"http://127.0.0.1:{worker.http_port}"
    status, refused = await call(http, "GET", f"{base}{VALIDITY}?token=x")
    assert (status, refused["errcode"]) == (403, "M_FORBIDDEN")
    status, refused = await call(
        http, "POST", f"{base}{C}/register", registration("a", {"type": "m.login.dummy"})
    )
    assert (status, refused["errcode"]) == (403, "M_FORBIDDEN")


def fanout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "registration-token", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_the_admin_command(make_worker: MakeWorker, database_url: str) -> None:
    await make_worker("p1", ["p1"])  # the schema
    made = await asyncio.to_thread(fanout, "--database-url", database_url, "create", "--uses-allowed", "3")
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)
    assert token["uses_allowed"] == 3 and len(token["token"]) == 16
    again = await asyncio.to_thread(
        fanout, "--database-url", database_url, "create", "--token", token["token"]
    )
    assert again.returncode == 2 and "exists already" in again.stderr and "Traceback" not in again.stderr
    listed = await asyncio.to_thread(fanout, "--database-url", database_url, "list")
    assert [json.loads(line)["token"] for line in listed.stdout.splitlines()] == [token["token"]]
    gone = await asyncio.to_thread(fanout, "--database-url", database_url, "delete", token["token"])
    assert gone.returncode == 0
    missing = await asyncio.to_thread(fanout, "--database-url", database_url, "delete", token["token"])
    assert missing.returncode == 2 and "no registration token" in missing.stderr
