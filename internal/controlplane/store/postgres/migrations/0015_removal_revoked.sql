-- The serial numbers (hex, a JSON array; '' for none) of the node
-- certificates the node's removals since its last join revoked
-- (store.NodeRemover): whichever replica later calls the removed node's
-- agent (to tear down a lease lost with it, or a failed move's
-- destination there) accepts them from the agent, and no other revoked
-- certificate. Cleared by a join.
ALTER TABLE nodes ADD COLUMN removal_revoked TEXT NOT NULL DEFAULT '';
