-- lease_plans keyed by (created_at, lease_id) instead of lease_id: lease
-- IDs are random, so every new plan landed on a random leaf of the key's
-- index (one more page written per commit); creation times only grow, so
-- new plans are appended. A lease's created_at never changes.
CREATE TABLE lease_plans_new (
    created_at BIGINT NOT NULL,
    lease_id   TEXT NOT NULL,
    plan       TEXT NOT NULL,
    PRIMARY KEY (created_at, lease_id)
);
INSERT INTO lease_plans_new (created_at, lease_id, plan)
    SELECT l.created_at, p.lease_id, p.plan FROM lease_plans p JOIN leases l ON l.id = p.lease_id ORDER BY l.created_at, p.lease_id;
DROP TABLE lease_plans;
ALTER TABLE lease_plans_new RENAME TO lease_plans;
