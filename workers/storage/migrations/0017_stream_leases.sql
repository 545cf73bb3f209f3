-- 0017: which writer writes each entity of a stored stream now (`workers.handlers.leases`): a
-- user's account data, device list or to-device sends, a room's receipts. The same lease as a
-- room's (0016): taken on the entity's first write there (when it has none, was released, or its
-- holder's instance lease ended), raising `epoch`, a key column through the unique index, so a take
-- waits for the writes in flight; each write checks its row FOR KEY SHARE in its own transaction.
-- The index on (user_id, stream_id) finds a sender's last send when its entity moves. Additive:
-- the previous release routes these writes by the stable hash alone and ignores the table.
CREATE TABLE stream_leases (
    stream   TEXT NOT NULL,
    entity   TEXT NOT NULL,
    writer   TEXT NOT NULL,
    epoch    BIGINT NOT NULL,
    released BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (stream, entity)
);
CREATE UNIQUE INDEX stream_leases_epoch ON stream_leases (stream, entity, epoch);
CREATE INDEX stream_leases_held ON stream_leases (writer) WHERE NOT released;
CREATE INDEX device_inbox_txns_sender_idx ON device_inbox_txns (user_id, stream_id);
