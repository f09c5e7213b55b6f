-- A shared accelerator lease's gateway key: a SHA-256 digest of its role
-- and role config (never the config itself). A slot partly held by shared
-- leases serves one gateway, so placement puts a share only on a slot that
-- is empty or held by leases of the same key (docs/accelerators.md,
-- "Shares, not slots"). '' for every other lease.
ALTER TABLE leases ADD COLUMN gateway TEXT NOT NULL DEFAULT '';
