-- 0006: device keys. A local device's uploaded keys live on its devices row; a remote user's
-- device list is a cached copy fetched from its server by the device-list writer.
ALTER TABLE devices ADD COLUMN keys_json TEXT;

CREATE TABLE remote_device_lists (
    user_id    TEXT    PRIMARY KEY,
    -- The devices as the remote server gave them: [{"device_id", "keys", ...}, ...] (JSON text).
    devices    TEXT    NOT NULL,
    -- Set when the cached copy may be out of date: the next query resyncs it through the writer.
    stale      BOOLEAN NOT NULL DEFAULT false,
    fetched_ts BIGINT  NOT NULL
);
