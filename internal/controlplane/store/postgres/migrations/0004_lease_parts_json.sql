-- A lease's parts (with their URIs) are kept on its row, as JSON in the
-- order of lease_parts.idx, so that reading a lease is one row. lease_parts
-- keeps the ranges for the capacity checks and the node and device
-- queries (live = 1 while the lease holds them).
ALTER TABLE leases ADD COLUMN parts TEXT NOT NULL DEFAULT '';
UPDATE leases SET parts = COALESCE((
    SELECT json_agg(json_build_object('node_id', p.node_id, 'device_id', p.device_id, 'offset', p.off, 'length', p.length, 'uri', p.uri) ORDER BY p.idx)::text
    FROM lease_parts p WHERE p.lease_id = leases.id), '[]');
-- devices.allocated is no longer maintained: it is computed from the live
-- parts when devices are read.
UPDATE devices SET allocated = 0;
