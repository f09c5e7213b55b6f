-- The hash of the node credential the node's last join proved itself
-- with (store.JoinNode), '' for none: it proves a join too until the
-- node's agent is heard with that join's answer (a heartbeat later than
-- the join clears it), so that an agent that lost the answer (it crashed
-- before writing it, or the answer was lost on the way) rejoins as its
-- node at once. Cleared by a takeover and by the node's removal.
ALTER TABLE nodes ADD COLUMN prev_credential_hash TEXT NOT NULL DEFAULT '';
