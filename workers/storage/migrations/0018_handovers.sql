-- 0018: where a room (below: a stored stream's entity) changed writer (`workers.handlers.leases`):
-- when `writer` took the room under `epoch` from another writer, `after_writer` had written the room's last event at
-- `after_stream_id` (read after the take fenced it). Every later event of `writer` in the room
-- depends on that position: readers apply `after_writer`'s rows up to it first (the events
-- stream's `after` row field). Additive: the previous release neither writes nor reads it.
CREATE TABLE room_handovers (
    room_id         TEXT NOT NULL,
    writer          TEXT NOT NULL,
    epoch           BIGINT NOT NULL,
    after_writer    TEXT NOT NULL,
    after_stream_id BIGINT NOT NULL,
    PRIMARY KEY (room_id, writer, epoch)
);
-- The same for a stored stream's entity (`stream_leases`): every later row of `writer` in `stream`
-- depends on `after_writer`'s rows up to `after_stream_id`.
CREATE TABLE stream_handovers (
    stream          TEXT NOT NULL,
    entity          TEXT NOT NULL,
    writer          TEXT NOT NULL,
    epoch           BIGINT NOT NULL,
    after_writer    TEXT NOT NULL,
    after_stream_id BIGINT NOT NULL,
    PRIMARY KEY (stream, entity, writer, epoch)
);
CREATE INDEX stream_handovers_writer ON stream_handovers (stream, writer, after_stream_id);
