-- History retention (docs/operations.md, "History retention"): the
-- server prunes ended leases and old events. Events are deleted from the
-- oldest on, never the newest (a plain INTEGER PRIMARY KEY is max(id) + 1,
-- so IDs still only grow); updates stay refused. history.events_through
-- is the greatest event ID pruned: a reader whose cursor is below it
-- missed events (410 Gone).
DROP TRIGGER events_append_only_delete;
CREATE TABLE history (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    events_through INTEGER NOT NULL DEFAULT 0
);
INSERT INTO history (id, events_through) VALUES (1, 0);
-- A pruned lease's idempotency key goes with it.
CREATE INDEX idempotency_keys_by_lease ON idempotency_keys (lease_id);
