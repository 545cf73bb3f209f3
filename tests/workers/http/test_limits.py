"""Oversized request lines and headers against a real worker: a 400 from the HTTP layer, a
counter, at most one log line per interval, and no traceback in the logs."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.workers.conftest import MakeWorker


async def _raw_request(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), 10)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("reason", "request_bytes"),
    [
        (
            "header",
            b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"a" * 100_000 + b"\r\n\r\n",
        ),
        ("line", b"GET /health?" + b"q" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    ],
)
async def test_oversized_requests_get_400_and_no_traceback(
    make_worker: MakeWorker, caplog: pytest.LogCaptureFixture, reason: str, request_bytes: bytes
) -> None:
    worker = await make_worker("w1", ["w1"])
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        answer = await _raw_request(worker.http_port, request_bytes)
        assert answer[:12] in (b"HTTP/1.0 400", b"HTTP/1.1 400"), answer[:100]
    assert not [r for r in caplog.records if r.exc_info], [
        r.getMessage() for r in caplog.records if r.exc_info
    ]
    warnings = [r for r in caplog.records if r.name == "workers.http.limits"]
    assert len(warnings) == 1  # rate-limited: three refusals, one line
    refused = sum(
        sample.value
        for metric in worker.registry.collect()
        if metric.name == "fanout_http_requests_refused"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )
    assert refused == 3
    # An ordinary request still works on the same worker.
    answer = await _raw_request(
        worker.http_port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 200") or answer.startswith(b"HTTP/1.1 503"), answer[:100]
