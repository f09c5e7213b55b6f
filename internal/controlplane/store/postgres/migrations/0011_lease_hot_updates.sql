-- A lease transition changes leases.state, which leases_by_state indexed:
-- no update of a lease could be a heap-only tuple (HOT) update, so each
-- transition wrote a new entry in every index of leases. In PostgreSQL
-- (the SQLite store's 0011 changes nothing), the sweep's index over the
-- leases that have not ended is now a partial index on a stored generated
-- column, ongoing, which only the transition into an ended state changes:
-- the transitions between reserved, active and releasing (two of a
-- lease's three) change no indexed column and, with room left on the
-- page (fillfactor), are HOT. Listing leases of states that have not
-- ended adds "ongoing" to its conditions (sqlstore.LiveLeasesFilter);
-- listing ended leases reads the table, as it mostly did.
ALTER TABLE leases ADD COLUMN ongoing BOOLEAN
    GENERATED ALWAYS AS (state NOT IN ('released', 'failed', 'lost', 'expired')) STORED;
DROP INDEX leases_by_state;
CREATE INDEX leases_ongoing ON leases (expires_at) WHERE ongoing;
ALTER TABLE leases SET (fillfactor = 70);
