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
