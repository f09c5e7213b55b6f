-- A lease's count (how many parts it holds) is what its parts say
-- (api.Holding: those not lost), computed when the lease is read: a
-- stored copy went stale when the lease was placed again, a part moved or
-- a bond lost a part, and nothing read it. The column goes.
ALTER TABLE leases DROP COLUMN count;
