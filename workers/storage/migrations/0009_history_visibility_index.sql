-- 0008: history visibility. Every read path asks a room's m.room.history_visibility changes
-- (workers/handlers/history_visibility.py); this index finds them without scanning the room.
CREATE INDEX events_history_visibility_idx ON events (room_id, stream_ordering)
    WHERE type = 'm.room.history_visibility';
