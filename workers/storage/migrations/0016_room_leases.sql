-- 0016: which persister writes each room now (`workers.handlers.room_leases`). A writer takes a
-- room's lease on its first write there (when the room has none, was released, or its holder's
-- instance lease ended), raising `epoch`; each write checks its rooms' rows FOR KEY SHARE in its own
-- transaction. The unique index makes `epoch` a key column, so a take waits for the writes in
-- flight. A planned stop sets `released`. Additive: the previous release routes rooms by the
-- stable hash alone and ignores the table.
CREATE TABLE room_leases (
    room_id  TEXT PRIMARY KEY,
    writer   TEXT NOT NULL,
    epoch    BIGINT NOT NULL,
    released BOOLEAN NOT NULL DEFAULT false
);
CREATE UNIQUE INDEX room_leases_epoch ON room_leases (room_id, epoch);
