-- 0010: one-time and fallback keys, per local device. A one-time key is handed out once: claiming
-- deletes its row. A device keeps one fallback key per algorithm, handed out (and marked used)
-- when the device has no one-time key of that algorithm left. Both go with their device.
CREATE TABLE e2e_one_time_keys (
    user_id   TEXT   NOT NULL,
    device_id TEXT   NOT NULL,
    algorithm TEXT   NOT NULL,
    key_id    TEXT   NOT NULL,
    -- The key object (or string) as uploaded (JSON text).
    key_json  TEXT   NOT NULL,
    added_ts  BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, algorithm, key_id),
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);

CREATE TABLE e2e_fallback_keys (
    user_id   TEXT    NOT NULL,
    device_id TEXT    NOT NULL,
    algorithm TEXT    NOT NULL,
    key_id    TEXT    NOT NULL,
    key_json  TEXT    NOT NULL,
    used      BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (user_id, device_id, algorithm),
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);
