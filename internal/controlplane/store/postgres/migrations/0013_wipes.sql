-- Block ranges being wiped (docs/placement.md, "Ranges being wiped");
-- SQLite's 0013 in PostgreSQL's dialect (BIGINT for offsets and times),
-- kept in the store so that every control-plane replica places around
-- them and the store refuses them (ErrCapacity), as it refuses a live
-- part: a row per range of an ended lease (or a range a lender refused
-- as being wiped, lease_id 'refused/…') on one node, written before its
-- lender is told to tear the lease down, deleted when the lender answers
-- the teardown or a heartbeat of the node, recorded after the mark, no
-- longer lists it as being wiped. mode is the lease's; at is when the
-- mark was written.
CREATE TABLE wipes (
    lease_id  TEXT NOT NULL,
    node_id   TEXT NOT NULL,
    idx       INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    off       BIGINT NOT NULL,
    length    BIGINT NOT NULL,
    mode      TEXT NOT NULL DEFAULT '',
    at        BIGINT NOT NULL,
    PRIMARY KEY (lease_id, node_id, idx)
);
CREATE INDEX wipes_by_device ON wipes (device_id);
CREATE INDEX wipes_by_node ON wipes (node_id);
-- The leases a node's lender last reported being wiped (its heartbeat's
-- wiping list), as ',id1,id2,' ('' for none).
ALTER TABLE nodes ADD COLUMN wiping TEXT NOT NULL DEFAULT '';
