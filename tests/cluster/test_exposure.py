"""Safe to expose, on real worker processes: registration closed by default and open to a token
holder; rate limits that hold as one across workers (sends spread over three workers are limited
as one client's, failed logins per account), with admins and allow-listed addresses exempt."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
from typing import Any

import aiohttp

from tests.cluster.conftest import MakeCluster
from tests.conftest import both_backends
from workers.harness.cluster_client import PASSWORD

C = "/_matrix/client/v3"
SECRET = "exposure-test-secret-0123456789"
TOKENS = "/_synapse/admin/v1/registration_tokens"


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, token: str | None = None,
    address: str | None = None,
) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if address is not None:
        headers["X-Forwarded-For"] = f"203.0.113.250, {address}"  # the balancer appends the last one
    async with http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(), resp.headers


async def admin_token(http: aiohttp.ClientSession, base: str, name: str) -> str:
    status, nonce, _ = await call(http, "GET", f"{base}/_synapse/admin/v1/register")
    digest = hmac.new(SECRET.encode(), digestmod=hashlib.sha1)
    digest.update(f"{nonce['nonce']}\0{name}\0{PASSWORD}\0admin".encode())
    body = {"nonce": nonce["nonce"], "username": name, "password": PASSWORD, "admin": True,
            "mac": digest.hexdigest()}  # fmt: skip
    status, account, _ = await call(http, "POST", f"{base}/_synapse/admin/v1/register", body)
    assert status == 200, account
    return str(account["access_token"])


def register_body(name: str, auth: dict[str, Any]) -> dict[str, Any]:
    return {"username": name, "password": PASSWORD, "auth": auth}


async def test_registration_is_closed_by_default_and_takes_a_token(make_cluster: MakeCluster) -> None:
    # The workers' own default (no registration setting), but sync2 takes tokens.
    cluster = await make_cluster(
        persisters=1, sync_workers=2, background_workers=0, registration=None,
        extra_config={"registration_shared_secret": SECRET},
        worker_config={"sync2": {"registration": "token"}},
    )  # fmt: skip
    dummy = register_body("alice", {"type": "m.login.dummy"})
    async with aiohttp.ClientSession() as http:
        for name in ("persister1", "sync1"):
            status, refused, _ = await call(http, "POST", f"{cluster.url(name)}{C}/register", dummy)
            assert (status, refused["errcode"]) == (403, "M_FORBIDDEN")
        root = await admin_token(http, cluster.url("sync1"), "root")
        status, token, _ = await call(
            http, "POST", f"{cluster.url('persister1')}{TOKENS}/new", {"uses_allowed": 1}, root
        )
        assert status == 200
        open_url = cluster.url("sync2")
        status, flows, _ = await call(http, "POST", f"{open_url}{C}/register", dummy)
        assert status == 401 and flows["flows"] == [{"stages": ["m.login.registration_token"]}]
        auth = {"type": "m.login.registration_token", "token": token["token"], "session": flows["session"]}
        status, alice, _ = await call(http, "POST", f"{open_url}{C}/register", register_body("alice", auth))
        assert status == 200 and alice["user_id"] == "@alice:localhost"
        status, me, _ = await call(http, "GET", f"{cluster.url('persister1')}{C}/account/whoami", None,
                                   alice["access_token"])  # fmt: skip
        assert me["user_id"] == "@alice:localhost"
        status, refused, _ = await call(http, "POST", f"{open_url}{C}/register", register_body("bob", auth))
        assert (status, refused["errcode"]) == (401, "M_UNAUTHORIZED")  # its one use is spent


@both_backends
async def test_rate_limits_hold_across_workers(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(
        persisters=1, sync_workers=2, background_workers=0,
        extra_config={
            "registration_shared_secret": SECRET, "x_forwarded": True,
            "rc_exempt_addresses": ["198.51.100.0/24"],
            "rc_message": {"per_second": 0.5, "burst_count": 3}, "rc_registration": None,
            "rc_room_creation": None, "rc_joins": None,
            "rc_login": {"address": None, "account": None,
                         "failed_attempts": {"per_second": 0.1, "burst_count": 2}},
        },
    )  # fmt: skip
    urls = [cluster.url(name) for name in ("persister1", "sync1", "sync2")]
    addresses = (f"192.0.2.{i}" for i in itertools.count(1))
    async with aiohttp.ClientSession() as http:
        tokens = {}
        for name in ("alice", "bob", "carol", "dave"):
            status, account, _ = await call(
                http, "POST", f"{urls[0]}{C}/register", register_body(name, {"type": "m.login.dummy"})
            )
            tokens[name] = account["access_token"]
        tokens["root"] = await admin_token(http, urls[0], "root")
        _, room, _ = await call(
            http, "POST", f"{urls[0]}{C}/createRoom", {"preset": "public_chat"}, tokens["alice"]
        )
        room_id = room["room_id"]
        for name in ("bob", "carol", "dave", "root"):
            await call(http, "POST", f"{urls[1]}{C}/rooms/{room_id}/join", {}, tokens[name])

        async def send(who: str, url: str, address: str) -> tuple[int, Any, Any]:
            txn = next(addresses)
            return await call(http, "PUT", f"{url}{C}/rooms/{room_id}/send/m.room.message/{txn}",
                              {"msgtype": "m.text", "body": "hi"}, tokens[who], address)  # fmt: skip

        # Alice spreads her sends over three workers, each from a new address: limited as one user.
        answers = [await send("alice", urls[i % 3], next(addresses)) for i in range(4)]
        assert [status for status, _, _ in answers] == [200, 200, 200, 429]
        _, refused, headers = answers[3]
        assert refused["errcode"] == "M_LIMIT_EXCEEDED" and 0 < refused["retry_after_ms"] <= 2000
        assert int(headers["Retry-After"]) >= 1
        await asyncio.sleep(refused["retry_after_ms"] / 1000)
        status, sent, _ = await send("alice", urls[1], next(addresses))
        assert status == 200 and sent["event_id"]

        # Bob and carol behind one address share its budget, whichever worker each uses.
        shared = "192.0.2.200"
        statuses = [(await send(who, urls[i % 3], shared))[0] for i, who in enumerate(["bob", "carol"] * 2)]
        assert statuses == [200, 200, 200, 429]
        # An admin is not limited; nor is an allow-listed address.
        assert [(await send("root", urls[i % 3], shared))[0] for i in range(5)] == [200] * 5
        assert [(await send("dave", urls[i % 3], "198.51.100.7"))[0] for i in range(5)] == [200] * 5

        # Wrong passwords are counted per account, on every worker: then even the right one waits.
        def login(name: str, password: str) -> dict[str, Any]:
            return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": name},
                    "password": password}  # fmt: skip

        for url in urls[:2]:
            status, _, _ = await call(
                http, "POST", f"{url}{C}/login", login("bob", "wrong"), None, next(addresses)
            )
            assert status == 403
        status, refused, _ = await call(http, "POST", f"{urls[2]}{C}/login", login("bob", PASSWORD), None,
                                        next(addresses))  # fmt: skip
        assert (status, refused["errcode"]) == (429, "M_LIMIT_EXCEEDED") and refused["retry_after_ms"] > 0
        status, _, _ = await call(http, "POST", f"{urls[2]}{C}/login", login("carol", PASSWORD), None,
                                  next(addresses))  # fmt: skip
        assert status == 200  # another account is not affected

        async with http.get(f"{urls[2]}/metrics") as resp:
            metrics = await resp.text()
        assert 'fanout_rate_limit_refused_total{action="login_failed",scope="account"} 1.0' in metrics
