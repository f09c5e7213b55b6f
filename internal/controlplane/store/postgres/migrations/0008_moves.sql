-- Moving leases between lenders and draining nodes (docs/operations.md,
-- "Moving leases and draining nodes"); SQLite's 0008 in PostgreSQL's
-- dialect (BIGINT for sizes and times).
--
-- A cordoned node gets no new part; its leases stay.
ALTER TABLE nodes ADD COLUMN cordoned INTEGER NOT NULL DEFAULT 0;

-- A lease part moving to another lender. While the move is open, its
-- destination range is a live lease_parts row of the lease with idx =
-- -1 - part (so that capacity checks and placement see it taken); the
-- move's end either makes it the part (done) or deletes it (failed).
-- committed = 1 once the lease points at the destination, before the
-- source has let go of the part.
CREATE TABLE lease_moves (
    id         TEXT PRIMARY KEY,
    lease_id   TEXT NOT NULL REFERENCES leases(id),
    part       INTEGER NOT NULL CHECK (part >= 0),
    kind       TEXT NOT NULL,
    state      TEXT NOT NULL,
    from_part  TEXT NOT NULL,
    to_part    TEXT NOT NULL,
    size       BIGINT NOT NULL DEFAULT 0,
    copied     BIGINT NOT NULL DEFAULT 0,
    reason     TEXT NOT NULL DEFAULT '',
    error      TEXT NOT NULL DEFAULT '',
    committed  INTEGER NOT NULL DEFAULT 0,
    started_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX lease_moves_by_lease ON lease_moves (lease_id, started_at);
CREATE INDEX lease_moves_open ON lease_moves (state) WHERE state NOT IN ('done', 'failed');
