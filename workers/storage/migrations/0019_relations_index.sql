-- 0019: relations. The client API refuses a reaction its sender already made to the same event, and
-- takes a relation to an event it does not have only when another event relates to it: both find
-- events by the event they relate to (`m.relates_to.event_id`, workers/storage/relations.py). The
-- predicate is a substring test, so an insert of an event without a relation parses no JSON.
-- Additive: the previous release ignores the index.
CREATE INDEX events_relates_to_idx ON events (((json::jsonb) -> 'content' -> 'm.relates_to' ->> 'event_id'))
    WHERE strpos(json, '"m.relates_to"') > 0;
