-- Rialto control plane schema, version 1. Times are Unix nanoseconds (UTC);
-- maps and plans are JSON text.
CREATE TABLE nodes (
    id              TEXT PRIMARY KEY,
    machine_id      TEXT NOT NULL UNIQUE,
    name            TEXT NOT NULL,
    state           TEXT NOT NULL,
    address         TEXT NOT NULL DEFAULT '',
    agent_url       TEXT NOT NULL DEFAULT '',
    endpoints       TEXT NOT NULL DEFAULT '{}',
    labels          TEXT NOT NULL DEFAULT '{}',
    fingerprint     TEXT NOT NULL DEFAULT '{}',
    health          TEXT NOT NULL DEFAULT '',
    credential_hash TEXT NOT NULL UNIQUE,
    agent_key       TEXT NOT NULL,
    last_heartbeat  INTEGER NOT NULL,
    joined_at       INTEGER NOT NULL
);

-- Resource Registration Table.
CREATE TABLE devices (
    id         TEXT PRIMARY KEY,
    node_id    TEXT NOT NULL REFERENCES nodes(id),
    name       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    state      TEXT NOT NULL,
    capacity   INTEGER NOT NULL CHECK (capacity >= 0),
    allocated  INTEGER NOT NULL DEFAULT 0 CHECK (allocated >= 0 AND allocated <= capacity),
    model      TEXT NOT NULL DEFAULT '',
    attributes TEXT NOT NULL DEFAULT '{}',
    sharing    TEXT NOT NULL DEFAULT '',
    UNIQUE (node_id, name)
);

-- Topology Status Table.
CREATE TABLE links (
    id            TEXT PRIMARY KEY,
    from_node     TEXT NOT NULL,
    to_node       TEXT NOT NULL,
    kind          TEXT NOT NULL DEFAULT 'ethernet',
    bandwidth_bps INTEGER NOT NULL DEFAULT 0,
    rtt_us        REAL NOT NULL DEFAULT 0,
    status        TEXT NOT NULL,
    load_bps      INTEGER NOT NULL DEFAULT 0,
    measured_at   INTEGER NOT NULL,
    UNIQUE (from_node, to_node)
);

-- Resource Allocation Table.
CREATE TABLE leases (
    id              TEXT PRIMARY KEY,
    state           TEXT NOT NULL,
    kind            TEXT NOT NULL,
    mode            TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    borrower        TEXT NOT NULL DEFAULT '',
    size            INTEGER NOT NULL DEFAULT 0,
    count           INTEGER NOT NULL DEFAULT 0,
    stripe_unit     INTEGER NOT NULL DEFAULT 0,
    uri             TEXT NOT NULL DEFAULT '',
    credential      TEXT NOT NULL DEFAULT '',
    ttl_seconds     INTEGER NOT NULL DEFAULT 0,
    expires_at      INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    reason          TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT NOT NULL DEFAULT '',
    plan            TEXT NOT NULL DEFAULT ''
);
CREATE INDEX leases_by_state ON leases (state, expires_at);
CREATE INDEX leases_by_tenant ON leases (tenant);

-- A lease's devices or partitions. live = 1 while the lease holds them.
CREATE TABLE lease_parts (
    lease_id  TEXT NOT NULL REFERENCES leases(id),
    idx       INTEGER NOT NULL,
    node_id   TEXT NOT NULL,
    device_id TEXT NOT NULL REFERENCES devices(id),
    off       INTEGER NOT NULL CHECK (off >= 0),
    length    INTEGER NOT NULL CHECK (length > 0),
    uri       TEXT NOT NULL DEFAULT '',
    live      INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (lease_id, idx)
);
CREATE INDEX parts_live_by_device ON lease_parts (device_id) WHERE live = 1;
CREATE INDEX parts_live_by_node ON lease_parts (node_id) WHERE live = 1;

CREATE TABLE profiles (
    id          TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    data        TEXT NOT NULL,
    source      TEXT NOT NULL DEFAULT '',
    measured_at INTEGER NOT NULL
);

-- Append-only audit log.
CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    type    TEXT NOT NULL,
    subject TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    state   TEXT NOT NULL DEFAULT ''
);
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;

-- API tokens, hashed (SHA-256); the secrets are never stored.
CREATE TABLE tokens (
    hash       TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    tenant     TEXT NOT NULL DEFAULT '',
    admin      INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);

CREATE TABLE idempotency_keys (
    tenant       TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    lease_id     TEXT NOT NULL REFERENCES leases(id),
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
);
