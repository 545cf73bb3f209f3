-- 0001: what the ID generators and the first streams need.
-- Applied migrations are never edited; later changes go in new files.

-- Each writer's own position per stream, upserted (autocommit) after every finished ID.
CREATE TABLE stream_positions (
    stream_name   TEXT   NOT NULL,
    instance_name TEXT   NOT NULL,
    stream_id     BIGINT NOT NULL
);
CREATE UNIQUE INDEX stream_positions_idx ON stream_positions (stream_name, instance_name);

-- Small integer per instance name, so tokens never carry instance names.
CREATE TABLE instance_map (
    instance_id   SERIAL PRIMARY KEY,
    instance_name TEXT NOT NULL UNIQUE
);

-- Live events have positive stream orderings (events_stream_seq); backfilled events
-- have negative ones (events_backfill_stream_seq, handed out negated).
CREATE TABLE events (
    stream_ordering BIGINT PRIMARY KEY,
    event_id        TEXT   NOT NULL UNIQUE,
    instance_name   TEXT   NOT NULL,
    room_id         TEXT   NOT NULL,
    type            TEXT   NOT NULL,
    state_key       TEXT,
    sender          TEXT   NOT NULL,
    json            TEXT   NOT NULL,
    received_ts     BIGINT NOT NULL
);
CREATE INDEX events_room_stream_idx ON events (room_id, stream_ordering);
CREATE INDEX events_instance_stream_idx ON events (instance_name, stream_ordering);

-- event_stream_ordering lets concurrent persisters keep the newest state (higher ordering wins).
CREATE TABLE current_state_events (
    room_id               TEXT   NOT NULL,
    type                  TEXT   NOT NULL,
    state_key             TEXT   NOT NULL,
    event_id              TEXT   NOT NULL,
    membership            TEXT,
    event_stream_ordering BIGINT NOT NULL,
    PRIMARY KEY (room_id, type, state_key)
);

-- Survives clean-up of current_state_events: the rooms a local user is (or was) in.
CREATE TABLE local_current_membership (
    user_id               TEXT   NOT NULL,
    room_id               TEXT   NOT NULL,
    membership            TEXT   NOT NULL,
    event_id              TEXT   NOT NULL,
    event_stream_ordering BIGINT NOT NULL,
    PRIMARY KEY (user_id, room_id)
);
CREATE INDEX local_current_membership_room_idx ON local_current_membership (room_id);

-- The caches stream. keys NULL means "invalidate the whole cache".
CREATE TABLE cache_invalidation_stream_by_instance (
    stream_id       BIGINT NOT NULL,
    instance_name   TEXT   NOT NULL,
    cache_func      TEXT   NOT NULL,
    keys            TEXT[],
    invalidation_ts BIGINT NOT NULL
);
CREATE INDEX cache_invalidation_stream_id_idx ON cache_invalidation_stream_by_instance (stream_id);
CREATE INDEX cache_invalidation_instance_idx
    ON cache_invalidation_stream_by_instance (instance_name, stream_id);

CREATE SEQUENCE events_stream_seq;
CREATE SEQUENCE events_backfill_stream_seq;
CREATE SEQUENCE cache_invalidation_stream_seq;
