-- 0014: room ids an admin blocked (`DELETE /_synapse/admin/v1/rooms/{roomId}` with block=true), as
-- Synapse's table of the same name: joins, invites and knocks into them are refused, also after
-- the room was purged. A purge without block leaves no row: the id is an unknown room again.
CREATE TABLE blocked_rooms (
    room_id    TEXT   PRIMARY KEY,
    user_id    TEXT   NOT NULL,
    blocked_ts BIGINT NOT NULL
);
