-- 0013: the redactions that applied: one row per redacted event, written in the same transaction as
-- the redaction, and only when the redacted event is stored in the redaction's room. Reads of event
-- bodies join it to prune the event by its room's version (room_version, copied from rooms when the
-- redaction is written: a room's version never changes) and to name the redaction. The first
-- redaction of an event is the one kept; the original content stays in events.json.
CREATE TABLE redactions (
    redacts      TEXT PRIMARY KEY,
    redaction_id TEXT NOT NULL,
    room_version TEXT NOT NULL
);

-- Redactions stored before this table existed apply too (the earliest of an event's, by stream
-- ordering). Additive: the previous release ignores the table.
INSERT INTO redactions (redacts, redaction_id, room_version)
SELECT DISTINCT ON (t.event_id) t.event_id, r.event_id, coalesce(ro.room_version, '1')
FROM events r
JOIN events t ON t.event_id = r.json::jsonb->'content'->>'redacts' AND t.room_id = r.room_id
LEFT JOIN rooms ro ON ro.room_id = r.room_id
WHERE r.type = 'm.room.redaction'
ORDER BY t.event_id, r.stream_ordering;
