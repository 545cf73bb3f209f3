-- 0005: what the Matrix client-server API needs: passwords, devices, tokens per device, uploaded
-- sync filters, room aliases, and the one-use nonces of shared-secret registration.

-- An argon2id hash (NULL: the account has no password and cannot use m.login.password).
ALTER TABLE users ADD COLUMN password_hash TEXT;
ALTER TABLE users ADD COLUMN admin BOOLEAN NOT NULL DEFAULT false;

CREATE TABLE devices (
    user_id      TEXT   NOT NULL REFERENCES users (user_id),
    device_id    TEXT   NOT NULL,
    display_name TEXT,
    created_ts   BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);

-- Tokens made before this migration have no device.
ALTER TABLE access_tokens ADD COLUMN device_id TEXT;
CREATE INDEX access_tokens_device_idx ON access_tokens (user_id, device_id);

CREATE TABLE user_filters (
    user_id   TEXT   NOT NULL,
    filter_id BIGINT NOT NULL,
    json      TEXT   NOT NULL,
    PRIMARY KEY (user_id, filter_id)
);

CREATE TABLE room_aliases (
    room_alias TEXT PRIMARY KEY,
    room_id    TEXT NOT NULL,
    creator    TEXT NOT NULL
);

CREATE TABLE registration_nonces (
    nonce      TEXT   PRIMARY KEY,
    created_ts BIGINT NOT NULL
);
