-- 0008: registration tokens (registration: token), as the Matrix spec's m.login.registration_token
-- and Synapse's admin API describe them. A token is usable while pending + completed is below
-- uses_allowed (NULL: no limit) and expiry_time (ms since the epoch; NULL: never) is ahead.
CREATE TABLE registration_tokens (
    token        TEXT    PRIMARY KEY,
    uses_allowed INTEGER CHECK (uses_allowed >= 0),
    pending      INTEGER NOT NULL DEFAULT 0,
    completed    INTEGER NOT NULL DEFAULT 0,
    expiry_time  BIGINT
);
