-- The cluster CA's revocation list, kept in the store so that control-plane
-- replicas holding copies of the CA directory agree on it
-- (store.Revocations; docs/operations.md, "Revocation across replicas"):
-- the node certificates issued (serial in hex, common name: the node's ID,
-- expiry in Unix seconds), so that any replica revokes those another one
-- issued; the serials revoked, with when (Unix seconds); and the list's
-- CRL number (one row), raised with every change, which every replica
-- signs its ca-crl.pem with.
CREATE TABLE issued_certs (
    serial      TEXT PRIMARY KEY,
    common_name TEXT NOT NULL,
    not_after   INTEGER NOT NULL
);
CREATE INDEX issued_certs_by_name ON issued_certs (common_name);
CREATE INDEX issued_certs_by_expiry ON issued_certs (not_after);
CREATE TABLE revoked_certs (
    serial     TEXT PRIMARY KEY,
    revoked_at INTEGER NOT NULL
);
CREATE TABLE crl_number (
    one    INTEGER PRIMARY KEY CHECK (one = 1),
    number INTEGER NOT NULL
);
INSERT INTO crl_number (one, number) VALUES (1, 0);
