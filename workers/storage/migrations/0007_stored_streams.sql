-- 0007: the stored streams beside events. Each stream has one sequence, and every table of the
-- stream takes its stream ids from it, so ids are unique across the stream's tables. No table
-- holds a "maximum id" row: a writer's position lives in stream_positions, upserted after commit.

-- account_data: global account data, room account data and room tags (three tables, one stream).
CREATE SEQUENCE account_data_stream_seq;
CREATE TABLE account_data (
    user_id           TEXT   NOT NULL,
    account_data_type TEXT   NOT NULL,
    content           TEXT   NOT NULL,
    stream_id         BIGINT NOT NULL,
    instance_name     TEXT   NOT NULL,
    PRIMARY KEY (user_id, account_data_type)
);
CREATE TABLE room_account_data (
    user_id           TEXT   NOT NULL,
    room_id           TEXT   NOT NULL,
    account_data_type TEXT   NOT NULL,
    content           TEXT   NOT NULL,
    stream_id         BIGINT NOT NULL,
    instance_name     TEXT   NOT NULL,
    PRIMARY KEY (user_id, room_id, account_data_type)
);
CREATE TABLE room_tags (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    tag     TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (user_id, room_id, tag)
);
-- The stream's row for a change of a room's tags (the tags themselves are in room_tags).
CREATE TABLE room_tags_revisions (
    user_id       TEXT   NOT NULL,
    room_id       TEXT   NOT NULL,
    stream_id     BIGINT NOT NULL,
    instance_name TEXT   NOT NULL,
    PRIMARY KEY (user_id, room_id)
);

-- device_lists: one row per changed user, and one outbound poke per remote server to tell.
CREATE SEQUENCE device_lists_stream_seq;
CREATE TABLE device_lists_stream (
    stream_id     BIGINT NOT NULL,
    user_id       TEXT   NOT NULL,
    instance_name TEXT   NOT NULL
);
CREATE TABLE device_lists_outbound_pokes (
    stream_id     BIGINT NOT NULL,
    destination   TEXT   NOT NULL,
    user_id       TEXT   NOT NULL,
    instance_name TEXT   NOT NULL
);
-- What the stand-in federation sender recorded as sent: one row per (server, user), the newest.
CREATE TABLE device_lists_outbound_sent (
    destination TEXT   NOT NULL,
    user_id     TEXT   NOT NULL,
    stream_id   BIGINT NOT NULL,
    sent_ts     BIGINT NOT NULL,
    PRIMARY KEY (destination, user_id)
);

-- to_device: messages for local devices, and for remote servers (sent by the stand-in sender).
CREATE SEQUENCE device_inbox_stream_seq;
CREATE TABLE device_inbox (
    user_id       TEXT   NOT NULL,
    device_id     TEXT   NOT NULL,
    stream_id     BIGINT NOT NULL,
    instance_name TEXT   NOT NULL,
    message_json  TEXT   NOT NULL
);
CREATE TABLE device_federation_outbox (
    destination   TEXT   NOT NULL,
    stream_id     BIGINT NOT NULL,
    instance_name TEXT   NOT NULL,
    messages_json TEXT   NOT NULL
);
-- A sendToDevice retried with the same transaction id is answered without writing again.
CREATE TABLE device_inbox_txns (
    user_id   TEXT   NOT NULL,
    device_id TEXT   NOT NULL,
    txn_id    TEXT   NOT NULL,
    stream_id BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, txn_id)
);

-- Rooms and their versions: written with a room's m.room.create event, or by a remote invite
-- (the room lives elsewhere; its version is needed to accept the invite later).
CREATE TABLE rooms (
    room_id      TEXT    PRIMARY KEY,
    room_version TEXT    NOT NULL,
    creator      TEXT,
    is_remote    BOOLEAN NOT NULL DEFAULT false
);
CREATE TABLE remote_invites (
    user_id     TEXT NOT NULL,
    room_id     TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    invite_state TEXT NOT NULL,
    PRIMARY KEY (user_id, room_id)
);
-- Rooms created before this migration: their version from their create event.
INSERT INTO rooms (room_id, room_version, creator)
SELECT e.room_id, coalesce((e.json::jsonb) -> 'content' ->> 'room_version', '1'), e.sender
FROM events e WHERE e.type = 'm.room.create' AND e.state_key = ''
ON CONFLICT DO NOTHING;

-- Every stream table is read by writer and range (catch-up) and by MAX(stream_id) (start-up).
CREATE INDEX account_data_stream_idx ON account_data (instance_name, stream_id);
CREATE INDEX account_data_id_idx ON account_data (stream_id);
CREATE INDEX account_data_user_idx ON account_data (user_id, stream_id);
CREATE INDEX room_account_data_stream_idx ON room_account_data (instance_name, stream_id);
CREATE INDEX room_account_data_id_idx ON room_account_data (stream_id);
CREATE INDEX room_account_data_user_idx ON room_account_data (user_id, stream_id);
CREATE INDEX room_tags_revisions_stream_idx ON room_tags_revisions (instance_name, stream_id);
CREATE INDEX room_tags_revisions_id_idx ON room_tags_revisions (stream_id);
CREATE INDEX room_tags_revisions_user_idx ON room_tags_revisions (user_id, stream_id);
CREATE INDEX device_lists_stream_idx ON device_lists_stream (instance_name, stream_id);
CREATE INDEX device_lists_stream_id_idx ON device_lists_stream (stream_id);
CREATE INDEX device_lists_stream_user_idx ON device_lists_stream (user_id, stream_id);
CREATE INDEX device_lists_outbound_pokes_idx ON device_lists_outbound_pokes (instance_name, stream_id);
CREATE INDEX device_lists_outbound_pokes_id_idx ON device_lists_outbound_pokes (stream_id);
CREATE INDEX device_inbox_stream_idx ON device_inbox (instance_name, stream_id);
CREATE INDEX device_inbox_id_idx ON device_inbox (stream_id);
CREATE INDEX device_inbox_device_idx ON device_inbox (user_id, device_id, stream_id);
CREATE INDEX device_federation_outbox_idx ON device_federation_outbox (instance_name, stream_id);
CREATE INDEX device_federation_outbox_id_idx ON device_federation_outbox (stream_id);
