-- 0014: room ids an admin blocked (`DELETE /_synapse/admin/v1/rooms/{roomId}` with block=true), as
-- Synapse's table of the same name: joins, invites and knocks into them are refused, also after
-- the room was purged. A purge without block leaves no row: the id is an unknown room again.
CREATE TABLE blocked_rooms (
    room_id    TEXT   PRIMARY KEY,
    user_id    TEXT   NOT NULL,
    blocked_ts BIGINT NOT NULL
);

-- The Delete Room API's version 2 tasks (`DELETE /_synapse/admin/v2/rooms/{roomId}`): any worker
-- answers their status; `instance_name` is the room's writer that runs the task, and marks its
-- unfinished ones failed when it starts again.
CREATE TABLE room_deletions (
    delete_id     TEXT   PRIMARY KEY,
    room_id       TEXT   NOT NULL,
    instance_name TEXT   NOT NULL,
    status        TEXT   NOT NULL,
    error         TEXT,
    shutdown_room TEXT,
    created_ts    BIGINT NOT NULL,
    updated_ts    BIGINT NOT NULL
);
CREATE INDEX room_deletions_room_idx ON room_deletions (room_id);
