-- Which removal record of a node removal_revoked holds (store.NodeRemover,
-- store.RemovalRecord): raised by every join, which clears the record, so
-- that a replica holding serials a removal revoked after its commit
-- (which the database refused then) adds them to that removal's record
-- only, never to a later removal's after the node joined again.
ALTER TABLE nodes ADD COLUMN removal_gen BIGINT NOT NULL DEFAULT 0;
