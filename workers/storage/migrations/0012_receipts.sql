-- 0012: the receipts stream. One row per (room, receipt type, user, thread): the latest event the
-- user has read up to, replaced only by a receipt for a later event. thread_id '' is the
-- unthreaded receipt (a thread id is never empty). Ids come from receipts_stream_seq.
CREATE SEQUENCE receipts_stream_seq;

CREATE TABLE receipts (
    room_id               TEXT   NOT NULL,
    receipt_type          TEXT   NOT NULL,
    user_id               TEXT   NOT NULL,
    thread_id             TEXT   NOT NULL DEFAULT '',
    event_id              TEXT   NOT NULL,
    -- The receipt's event's place in the room: a receipt for an earlier event does not replace it.
    event_stream_ordering BIGINT NOT NULL,
    -- The receipt's data as the wire carries it (JSON text): {"ts": ms}.
    data                  TEXT   NOT NULL,
    stream_id             BIGINT NOT NULL,
    instance_name         TEXT   NOT NULL,
    PRIMARY KEY (room_id, receipt_type, user_id, thread_id)
);
CREATE INDEX receipts_stream_idx ON receipts (instance_name, stream_id);
CREATE INDEX receipts_room_stream_idx ON receipts (room_id, stream_id);
