-- The expiry (Unix seconds) of each revoked certificate, and whether it
-- has expired off the list (store.Revocations.ExpireRevoked): an expired
-- certificate is refused anyway, so the list drops it, under a higher
-- number. Its row stays, out of the list: a copy of the CA directory whose
-- ca-crl.pem still names the serial does not record it again
-- (pki.SharedList.Expired). The expiry is the one recorded with the
-- certificate's issue (issued_certs), set below for the rows already
-- there; a row whose issue was not recorded is left NULL here
-- (store.RevocationList.NoExpiry), and the next sync of a replica's list
-- gives it the expiry the replica's CA directory knows (its issued.txt,
-- or else the latest expiry of its CA certificates, which no certificate
-- they signed outlives: controlplane's dateRevoked), after which it
-- leaves the list once expired as the others do.
ALTER TABLE revoked_certs ADD COLUMN not_after INTEGER;
ALTER TABLE revoked_certs ADD COLUMN expired INTEGER NOT NULL DEFAULT 0;
UPDATE revoked_certs SET not_after = (SELECT i.not_after FROM issued_certs i WHERE i.serial = revoked_certs.serial);
