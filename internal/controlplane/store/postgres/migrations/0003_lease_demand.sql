-- What a lease's request asked of its devices, for placement's predictions
-- of saturation and of a new lease's impact on running ones: the bandwidth
-- in bytes/s (0: as fast as it can), the bytes to move (0: open-ended) and
-- the completion deadline in Unix nanoseconds (0: none).
ALTER TABLE leases ADD COLUMN demand_bps DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN work_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN deadline_at BIGINT NOT NULL DEFAULT 0;
