-- A lease's plan (placement's decision and its explanation, JSON of about
-- 1-2 KB) moves off the lease row into its own table, written in the same
-- transaction as the lease: a lease row is rewritten on every transition
-- (reserved, active, releasing, released), and the plan made it several
-- times larger than the rest of the row. leases.plan is left empty.
CREATE TABLE lease_plans (
    lease_id TEXT PRIMARY KEY,
    plan     TEXT NOT NULL
);
INSERT INTO lease_plans (lease_id, plan) SELECT id, plan FROM leases WHERE plan != '';
UPDATE leases SET plan = '' WHERE plan != '';
