"""Ended access tokens across real worker processes: every worker caches the token's owner, and an
end on one worker is refused there at once and on every other worker within a replication delay."""

from __future__ import annotations

import re
import time
from typing import Any

import aiohttp
import pytest

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import CLIENT, PASSWORD

#: A bound on one replication delay here (announce interval 0.2 s, a loaded 2-core machine).
WITHIN_S = 5.0


@pytest.fixture
async def cluster(make_cluster: MakeCluster) -> LocalCluster:
    return await make_cluster(persisters=2, sync_workers=2, background_workers=0)


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def whoami(http: aiohttp.ClientSession, url: str, token: str) -> int:
    status, _ = await call(http, "GET", f"{url}{CLIENT}/account/whoami", token=token)
    return status


async def session(http: aiohttp.ClientSession, url: str, user: str, device: str) -> str:
    """Log `user` in on `url` with a device of its own; the token (then known to every worker)."""
    login = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
             "password": PASSWORD, "device_id": device}  # fmt: skip
    status, body = await call(http, "POST", f"{url}{CLIENT}/login", login)
    assert status == 200, body
    return str(body["access_token"])


async def cached_everywhere(http: aiohttp.ClientSession, cluster: LocalCluster, *tokens: str) -> None:
    for token in tokens:
        for url in cluster.urls.values():
            assert await whoami(http, url, token) == 200


async def refused_within(http: aiohttp.ClientSession, url: str, token: str) -> float:
    """Seconds until `url` refuses `token` (polled, bounded by WITHIN_S)."""
    started = time.monotonic()
    while (status := await whoami(http, url, token)) == 200 and time.monotonic() - started < WITHIN_S:
        pass
    assert status == 401, f"{url} still takes the ended token after {WITHIN_S}s"
    return time.monotonic() - started


async def register(http: aiohttp.ClientSession, url: str, name: str) -> str:
    body = {"username": name, "password": PASSWORD, "auth": {"type": "m.login.dummy"}}
    status, account = await call(http, "POST", f"{url}{CLIENT}/register", body)
    assert status == 200, account
    return str(account["user_id"])


async def test_an_ended_token_is_refused_at_once_where_it_ended_and_soon_everywhere(
    cluster: LocalCluster, http: aiohttp.ClientSession
) -> None:
    urls = cluster.urls
    user = await register(http, urls["sync1"], "alice")
    for where, ender in (("sync1", "logout"), ("sync2", "delete"), ("persister1", "logout"),
                         ("persister2", "delete")):  # fmt: skip
        here = urls[where]
        ended = await session(http, here, user, f"END{where.upper()}")
        kept = await session(http, here, user, f"KEEP{where.upper()}")
        await cached_everywhere(http, cluster, ended, kept)
        if ender == "logout":
            assert await call(http, "POST", f"{here}{CLIENT}/logout", {}, token=ended) == (200, {})
        else:  # device deletion, with the password stage, from the other device
            auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
                    "password": PASSWORD}  # fmt: skip
            status, body = await call(
                http, "DELETE", f"{here}{CLIENT}/devices/END{where.upper()}", {"auth": auth}, token=kept
            )
            assert status == 200, body
        assert await whoami(http, here, ended) == 401, f"{where} took the token it just ended"
        for other in urls.values():
            await refused_within(http, other, ended)
            assert await whoami(http, other, kept) == 200  # the user's other device is untouched

    # logout/all: every token of the user, wherever it was cached.
    tokens = [await session(http, url, user, f"ALL{i}") for i, url in enumerate(urls.values())]
    await cached_everywhere(http, cluster, *tokens)
    assert await call(http, "POST", f"{urls['sync2']}{CLIENT}/logout/all", {}, token=tokens[0]) == (200, {})
    for token in tokens:
        assert await whoami(http, urls["sync2"], token) == 401
        for url in urls.values():
            await refused_within(http, url, token)


async def test_a_password_change_ends_every_other_session_everywhere(
    cluster: LocalCluster, http: aiohttp.ClientSession
) -> None:
    urls = cluster.urls
    user = await register(http, urls["persister1"], "bob")
    asker = await session(http, urls["sync1"], user, "ASKER")
    same_device = await session(http, urls["sync2"], user, "ASKER")  # a second token on the device
    other = await session(http, urls["persister2"], user, "OTHER")
    await cached_everywhere(http, cluster, asker, same_device, other)
    change = {"new_password": "a new one", "logout_devices": True}
    status, flows = await call(http, "POST", f"{urls['sync2']}{CLIENT}/account/password", change, token=asker)
    assert status == 401 and flows["flows"] == [{"stages": ["m.login.password"]}]
    auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
            "password": PASSWORD, "session": flows["session"]}  # fmt: skip
    change["auth"] = auth
    password_url = f"{urls['sync2']}{CLIENT}/account/password"
    assert await call(http, "POST", password_url, change, token=asker) == (200, {})
    for ended in (same_device, other):
        assert await whoami(http, urls["sync2"], ended) == 401
        for url in urls.values():
            await refused_within(http, url, ended)
    for url in urls.values():  # the session that asked stays, and so does its device
        assert await whoami(http, url, asker) == 200
    status, devices = await call(http, "GET", f"{urls['sync1']}{CLIENT}/devices", token=asker)
    assert [d["device_id"] for d in devices["devices"]] == ["ASKER"]
    login = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}}
    login_url = f"{urls['sync1']}{CLIENT}/login"
    assert (await call(http, "POST", login_url, {**login, "password": PASSWORD}))[0] == 403
    assert (await call(http, "POST", login_url, {**login, "password": "a new one"}))[0] == 200


async def token_cache_hits(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    found = re.search(r'^fanout_cache_hits_total\{cache="get_user_by_access_token"\} (\S+)$', text, re.M)
    assert found is not None, "no token cache on this worker"
    return float(found.group(1))


async def test_a_device_lists_writer_that_writes_no_events_ends_tokens_everywhere(
    make_cluster: MakeCluster, http: aiohttp.ClientSession
) -> None:
    """sync2 writes device_lists and no events: it writes the caches rows of the tokens it ends too.
    persister1 serves no reads, and caches tokens all the same."""
    cluster = await make_cluster(
        persisters=1, sync_workers=2, background_workers=0, stream_writers={"device_lists": ["sync2"]},
        write_only_persisters=True,
    )  # fmt: skip
    urls = cluster.urls
    user = await register(http, urls["sync1"], "carol")
    token = await session(http, urls["persister1"], user, "PHONE")
    before = await token_cache_hits(http, urls["persister1"])
    await cached_everywhere(http, cluster, token)
    await cached_everywhere(http, cluster, token)
    assert await token_cache_hits(http, urls["persister1"]) > before
    assert await call(http, "POST", f"{urls['sync1']}{CLIENT}/logout", {}, token=token) == (200, {})
    assert await whoami(http, urls["sync1"], token) == 401
    for url in urls.values():
        await refused_within(http, url, token)
