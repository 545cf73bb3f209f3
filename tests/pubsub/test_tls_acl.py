"""`user:password@` (ACL) and `rediss://` (TLS) URLs carry replication like plain ones.

The bundled Valkey has no TLS, so the TLS test runs Debian's `redis-server` (found on PATH or via
REDIS_SERVER_BIN; `make test` installs it when missing) on a free port with a throw-away CA.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import trustme
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from tests.pubsub.conftest import NodeFactory, wait_for
from workers.embedded.services import ServiceError, free_port, redis_server_bin


async def _replicates(make_node: NodeFactory, url: str) -> None:
    reader = await make_node("r1", url=url)
    writer = await make_node("w1", url=url)
    await writer.write(20)
    await wait_for(lambda: reader.applied_count("w1") == 20, what="20 rows over the URL")


async def test_acl_user_in_the_url(make_node: NodeFactory, redis_url: str) -> None:
    user, password = f"fanout-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = aioredis.from_url(redis_url)
    await admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    try:
        host_port = redis_url.split("://", 1)[1]
        await _replicates(make_node, f"redis://{user}:{password}@{host_port}")
        with pytest.raises((AuthenticationError, ResponseError)):
            await aioredis.from_url(f"redis://{user}:wrong@{host_port}").ping()
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def test_an_acl_user_refused_client_reply_still_replicates(
    make_node: NodeFactory, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A user whose ACL leaves CLIENT REPLY out: the writer is told no on its first publish, says
    so once, and from then on reads each publish's replies; every row still gets through."""
    user, password = f"fanout-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = aioredis.from_url(redis_url)
    await admin.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all", "-client|reply"
    )
    try:
        host_port = redis_url.split("://", 1)[1]
        await _replicates(make_node, f"redis://{user}:{password}@{host_port}")
        refused = [r for r in caplog.records if "refused CLIENT REPLY" in r.getMessage()]
        assert len(refused) == 2, refused  # the reader's first publish (REPLICATE), the writer's
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[str]:
    try:
        binary = redis_server_bin("system")
    except ServiceError as e:
        raise AssertionError(f"the TLS test needs Debian's redis-server: {e}") from None
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    port = free_port()
    process = subprocess.Popen(
        [str(binary), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(tmp_path / "cert.pem"), "--tls-key-file", str(tmp_path / "key.pem"),
         "--tls-ca-cert-file", str(tmp_path / "ca.pem"), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'ca.pem'}"
    finally:
        process.terminate()
        process.wait(10)


async def test_tls_url(make_node: NodeFactory, tls_redis: str) -> None:
    client = aioredis.from_url(tls_redis)
    await wait_for_ping(client)
    await client.aclose()
    await _replicates(make_node, tls_redis)


async def wait_for_ping(client: aioredis.Redis) -> None:
    for _ in range(100):
        try:
            if await client.ping():
                return
        except (OSError, RedisError):
            pass
        await asyncio.sleep(0.05)
    raise AssertionError("TLS redis-server did not answer")
