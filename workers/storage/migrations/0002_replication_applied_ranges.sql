-- 0002: what each subscribing worker applied, for the invalidation audit's reconciliation (issue 6).
--
-- Contract for a worker that applies a replicated stream (today: sync workers on `caches`):
--
-- * One row claims: "worker `worker_name`, in its process run `run_id`, applied EVERY row of stream
--   `stream_name` written by writer `instance_name` whose stream_id satisfies from_id < stream_id <= to_id".
--   IDs in that interval that belong to other writers, or were never used, are simply not rows of this
--   writer: the claim is about the writer's rows, like a replication token.
-- * `run_id` is unique per process start (e.g. a uuid4 hex). A new run starts with empty in-memory caches,
--   so rows published between two runs were not needed and are NOT a gap; only holes inside one run are.
-- * At start-up, for each writer the worker tracks, insert (from_id = to_id = the position it starts from,
--   i.e. that writer's persisted-upto). An empty range marks where the run began.
-- * After applying rows contiguously (RDATA in order, or a successful catch-up from the database), extend
--   the current row: UPDATE ... SET to_id = <new position>, updated_ts = now. Doing this once per batch or
--   once per second is enough; the record may lag behind the worker, never run ahead of it.
-- * If the worker ever moves its position forward WITHOUT applying the rows in between (it dropped them,
--   gave up a catch-up, skipped to a newer POSITION), it must start a NEW row with from_id = the position it
--   jumped to. The hole between the two rows is exactly what the audit reports.
-- * Write outside the stream's write transactions (autocommit), like stream_positions.
--
-- Rows per (worker, run, writer) stay at 1 + the number of holes, so the record is as cheap as a position,
-- but unlike a position it can show a hole in the middle.
CREATE TABLE replication_applied_ranges (
    worker_name   TEXT   NOT NULL,
    run_id        TEXT   NOT NULL,
    stream_name   TEXT   NOT NULL,
    instance_name TEXT   NOT NULL,
    from_id       BIGINT NOT NULL,
    to_id         BIGINT NOT NULL,
    updated_ts    BIGINT NOT NULL,
    PRIMARY KEY (worker_name, run_id, stream_name, instance_name, from_id),
    CHECK (to_id >= from_id)
);
CREATE INDEX replication_applied_ranges_stream_idx ON replication_applied_ranges (stream_name, worker_name);
