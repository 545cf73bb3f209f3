-- Who holds each instance name (the lock itself is a session advisory lock; this row only lets a
-- second process name the holder in its error line).
CREATE TABLE instance_leases (
    lease_key TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    since TIMESTAMPTZ NOT NULL DEFAULT now()
);
