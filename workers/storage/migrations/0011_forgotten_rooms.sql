-- 0011: rooms a user forgot after leaving them. The row holds the stream ordering of the membership
-- event (the leave or ban) the user forgot: the room stays forgotten while that is the user's
-- latest membership in it, and shows again once the user joins or is invited anew.
CREATE TABLE forgotten_rooms (
    user_id                    TEXT   NOT NULL,
    room_id                    TEXT   NOT NULL,
    membership_stream_ordering BIGINT NOT NULL,
    forgotten_ts               BIGINT NOT NULL,
    PRIMARY KEY (user_id, room_id)
);
