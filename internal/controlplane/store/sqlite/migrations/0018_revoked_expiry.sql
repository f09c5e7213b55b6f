-- The expiry (Unix seconds) of each revoked certificate, where the store
-- knows it (its issue recorded in issued_certs; NULL otherwise: such a
-- serial stays on the list for ever), and whether it has expired off
-- the list (store.Revocations.ExpireRevoked): an expired certificate is
-- refused anyway, so the list drops it, under a higher number. Its row
-- stays, out of the list: a copy of the CA directory whose ca-crl.pem
-- still names the serial does not record it again (pki.SharedList.Expired).
ALTER TABLE revoked_certs ADD COLUMN not_after INTEGER;
ALTER TABLE revoked_certs ADD COLUMN expired INTEGER NOT NULL DEFAULT 0;
UPDATE revoked_certs SET not_after = (SELECT i.not_after FROM issued_certs i WHERE i.serial = revoked_certs.serial);
