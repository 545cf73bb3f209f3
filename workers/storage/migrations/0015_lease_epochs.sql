-- 0015: instance leases as rows (`workers.instance_lease`): the lease ends at `expires_at` (renewed
-- by its holder's heartbeat) and every take raises `epoch`, the fencing token a holder's writes
-- check in their own transaction. The unique index makes `epoch` a key column, so a take (which
-- changes it) waits for writes holding KEY SHARE on the row, while renewals (which do not) never do.
-- Additive: the previous release keeps its session advisory lock and ignores both columns; existing
-- rows start expired.
ALTER TABLE instance_leases
    ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN expires_at TIMESTAMPTZ NOT NULL DEFAULT now();
CREATE UNIQUE INDEX instance_leases_epoch ON instance_leases (lease_key, epoch);
