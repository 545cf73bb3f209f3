"""Health over HTTP against real workers: live, ready with Retry-After when not, and a silent
writer making a reader `degraded` while it stays ready; metrics gauges without any /health call."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.workers.conftest import MakeWorker
from workers.embedded.services import free_port


async def _get(session: aiohttp.ClientSession, port: int, path: str) -> tuple[int, dict[str, str], str]:
    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, dict(response.headers), await response.text()


async def _wait_for(session: aiohttp.ClientSession, port: int, degraded: bool) -> dict[str, object]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        async with session.get(f"http://127.0.0.1:{port}/health/ready") as response:
            body = await response.json()
            if body["degraded"] is degraded:
                assert response.status == 200, body
                return dict(body)
        await asyncio.sleep(0.1)
    raise AssertionError(f"never degraded={degraded}")


async def test_a_silent_writer_degrades_a_reader_that_stays_ready(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    writer = await make_worker("p1", ["p1"])
    reader = await make_worker("r1", ["p1"], silent_writer_intervals=2)
    assert (await _get(http, reader.http_port, "/health/live"))[0] == 200
    status, _, _ = await _get(http, reader.http_port, "/health")
    assert status == 200
    await _wait_for(http, reader.http_port, degraded=False)
    metrics_port = reader.http_port

    await writer.stop()
    body = await _wait_for(http, reader.http_port, degraded=True)
    assert body["reasons"] == []
    assert any("writer p1 of events silent" in reason for reason in body["degraded_reasons"])  # type: ignore[attr-defined]
    _, _, text = await _get(http, metrics_port, "/metrics")
    assert "fanout_worker_degraded 1.0" in text
    assert "fanout_worker_ready 1.0" in text

    await make_worker("p1", ["p1"])
    await _wait_for(http, reader.http_port, degraded=False)


async def test_a_stopping_worker_is_unready_with_retry_after(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    _, _, text = await _get(http, worker.http_port, "/metrics")  # no /health call before this scrape
    assert "fanout_worker_ready 1.0" in text
    worker._accepting = False
    status, headers, body = await _get(http, worker.http_port, "/health/ready")
    assert status == 503
    assert headers["Retry-After"] == "5"
    assert "stopping" in body
    assert (await _get(http, worker.http_port, "/health/live"))[0] == 200


async def test_a_separate_metrics_listener_and_request_timing_by_route(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    worker = await make_worker("p1", ["p1"], metrics_port=port)
    assert (await _get(http, worker.http_port, "/health/ready"))[0] == 200
    status, _, text = await _get(http, port, "/metrics")
    assert status == 200
    assert 'fanout_http_request_seconds_count{method="GET",route="/health/ready"} 1.0' in text
    assert (await _get(http, port, "/health/live"))[0] == 200


async def test_cache_sizes_are_current_on_the_first_scrape(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    _, _, text = await _get(http, worker.http_port, "/metrics")
    assert "fanout_cache_entries{" in text
    assert "fanout_sync_waiting 0.0" in text
