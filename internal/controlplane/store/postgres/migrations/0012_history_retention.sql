-- History retention (docs/operations.md, "History retention"): the
-- server prunes ended leases and old events. Events are deleted from the
-- oldest on (IDs come from a sequence and only grow); updates stay
-- refused. history.events_through is the greatest event ID pruned: a
-- reader whose cursor is below it missed events (410 Gone).
DROP TRIGGER events_append_only_delete ON events;
CREATE TABLE history (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    events_through BIGINT NOT NULL DEFAULT 0
);
INSERT INTO history (id, events_through) VALUES (1, 0);
-- A pruned lease's idempotency key goes with it.
CREATE INDEX idempotency_keys_by_lease ON idempotency_keys (lease_id);
