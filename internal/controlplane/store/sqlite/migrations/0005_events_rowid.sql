-- events.id without AUTOINCREMENT: AUTOINCREMENT made every commit that
-- appends events also write sqlite_sequence (one more page). Events are
-- never deleted (the triggers refuse it), so a plain INTEGER PRIMARY KEY
-- (max(id) + 1) still gives ids that only grow, as `rialto events` and
-- watchers rely on.
CREATE TABLE events_new (
    id      INTEGER PRIMARY KEY,
    at      INTEGER NOT NULL,
    type    TEXT NOT NULL,
    subject TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    state   TEXT NOT NULL DEFAULT ''
);
INSERT INTO events_new (id, at, type, subject, message, state)
    SELECT id, at, type, subject, message, state FROM events ORDER BY id;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
