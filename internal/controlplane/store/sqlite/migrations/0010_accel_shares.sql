-- A shared accelerator lease's gateway key: a SHA-256 digest of its role
-- and role config (never the config itself). A slot partly held by shared
-- leases serves one gateway, so placement puts a share only on a slot that
-- is empty or held by leases of the same key (docs/accelerators.md,
-- "Shares, not slots"). '' for every other lease.
ALTER TABLE leases ADD COLUMN gateway TEXT NOT NULL DEFAULT '';
-- Accelerator capacity counts slot units from now on (api.SlotUnits, 1000
-- a slot), so that a shared lease holds a share of one slot; agents report
-- slots and the control plane converts at join. Devices registered before
-- are converted here. Accel leases made before hold whole-slot ranges:
-- release them (or drain their nodes) before upgrading
-- (docs/operations.md, "Upgrading").
UPDATE devices SET capacity = capacity * 1000 WHERE kind = 'accel';
