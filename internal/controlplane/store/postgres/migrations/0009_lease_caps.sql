-- A block lease's caps, from its request: the bandwidth cap in bytes/s and
-- the IOPS cap (0: none); SQLite's 0009 in PostgreSQL's dialect. Every
-- lender of the lease enforces them, so they must outlive the request: a
-- part moved to another lender is prepared there with them
-- (docs/operations.md, "Moving leases and draining nodes"). Leases created
-- before this migration have none recorded.
ALTER TABLE leases ADD COLUMN bandwidth_cap BIGINT NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN iops_cap BIGINT NOT NULL DEFAULT 0;
