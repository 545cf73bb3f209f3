"""Positions are checked against the truth: no line moves a writer past the stream's sequence.

A forged `POSITION test_rows w1 0 900000000`, or a well-formed RDATA far ahead, published under a
real, running writer's name: every reader refuses it (counted, the token unchanged), delivery goes
on exactly once and in order, and a writer that heard it still allocates (no position above the
sequence ever reaches its own bookkeeping)."""

from __future__ import annotations

import json

from tests.pubsub.conftest import STREAM, NodeFactory, check_history, publish_raw, wait_for


def _rejected(node: object, reason: str) -> float:
    return node.metric("fanout_repl_rejected_total", reason=reason)  # type: ignore[attr-defined, no-any-return]


async def test_a_forged_position_beyond_the_sequence_moves_nothing(
    make_node: NodeFactory, redis_url: str, channel_prefix: str
) -> None:
    reader = await make_node("r1", writers=["w1", "w2"])
    w1 = await make_node("w1", writers=["w1", "w2"])
    w2 = await make_node("w2", writers=["w1", "w2"])
    await w1.write(3)
    await wait_for(lambda: reader.applied_count("w1") == 3, what="first rows")
    before = reader.client.read_streams[STREAM].current_token("w1")
    await publish_raw(redis_url, channel_prefix, [f"POSITION {STREAM} w1 0 900000000"])
    await wait_for(lambda: _rejected(reader, "beyond_sequence") >= 1, what="the reader refusing it")
    await wait_for(lambda: _rejected(w2, "beyond_sequence") >= 1, what="the other writer refusing it")
    assert reader.client.read_streams[STREAM].current_token("w1") == before
    assert w2.generator.get_current_token_for_writer("w1") < 900000000
    await w2.write(2)  # a writer that heard the forgery still allocates and persists
    await w1.write(4)
    await wait_for(lambda: reader.applied_count() == 9, what="rows written after the forgery")
    check_history(reader.applied, {"w1": w1.written, "w2": w2.written})


async def test_forged_rdata_far_ahead_is_refused_and_real_rows_still_arrive(
    make_node: NodeFactory, redis_url: str, channel_prefix: str
) -> None:
    reader = await make_node("r1", writers=["w1"])
    w1 = await make_node("w1", writers=["w1"])
    await w1.write(2)
    await wait_for(lambda: reader.applied_count() == 2, what="first rows")
    cur = reader.client.read_streams[STREAM].current_token("w1")
    row = json.dumps([cur, 1, "w1", 999, "forged"], separators=(",", ":"))
    await publish_raw(redis_url, channel_prefix, [f"RDATA {STREAM} w1 {cur + 1_000_000} {row}"])
    await wait_for(lambda: _rejected(reader, "beyond_sequence") >= 1, what="the refusal")
    assert all(seq != 999 for _, _, seq in reader.applied)
    await w1.write(3)
    await wait_for(lambda: reader.applied_count() == 5, what="real rows after the forgery")
    check_history(reader.applied, {"w1": w1.written})
