-- 0003: client accounts, membership history look-ups, and the room-statistics background task.

CREATE TABLE users (
    user_id    TEXT PRIMARY KEY,
    created_ts BIGINT NOT NULL
);

-- Only a SHA-256 of each access token is stored.
CREATE TABLE access_tokens (
    token_hash BYTEA PRIMARY KEY,
    user_id    TEXT   NOT NULL REFERENCES users (user_id),
    created_ts BIGINT NOT NULL
);

-- A user's membership events, for visibility at a given stream position.
CREATE INDEX events_membership_idx ON events (state_key, room_id, stream_ordering)
    WHERE type = 'm.room.member';

CREATE TABLE room_stats (
    room_id        TEXT   PRIMARY KEY,
    messages       BIGINT NOT NULL DEFAULT 0,
    state_changes  BIGINT NOT NULL DEFAULT 0,
    joined_members BIGINT NOT NULL DEFAULT 0
);

-- How far each background task has processed a stream (by persisted-upto position).
CREATE TABLE background_progress (
    task_name   TEXT   PRIMARY KEY,
    stream_name TEXT   NOT NULL,
    position    BIGINT NOT NULL,
    updated_ts  BIGINT NOT NULL
);
