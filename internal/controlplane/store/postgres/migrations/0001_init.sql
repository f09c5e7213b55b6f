-- Rialto control plane schema, version 1 (PostgreSQL's dialect of the
-- SQLite store's 0001_init.sql: BIGINT for 64-bit integers, BOOLEAN for
-- flags, a sequence for event IDs, a trigger function for append-only).
-- Times are Unix nanoseconds (UTC); maps and plans are JSON text.
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
    last_heartbeat  BIGINT NOT NULL,
    joined_at       BIGINT NOT NULL
);

-- Resource Registration Table.
CREATE TABLE devices (
    id         TEXT PRIMARY KEY,
    node_id    TEXT NOT NULL REFERENCES nodes(id),
    name       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    state      TEXT NOT NULL,
    capacity   BIGINT NOT NULL CHECK (capacity >= 0),
    allocated  BIGINT NOT NULL DEFAULT 0 CHECK (allocated >= 0 AND allocated <= capacity),
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
    bandwidth_bps BIGINT NOT NULL DEFAULT 0,
    rtt_us        DOUBLE PRECISION NOT NULL DEFAULT 0,
    status        TEXT NOT NULL,
    load_bps      BIGINT NOT NULL DEFAULT 0,
    measured_at   BIGINT NOT NULL,
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
    size            BIGINT NOT NULL DEFAULT 0,
    count           BIGINT NOT NULL DEFAULT 0,
    stripe_unit     BIGINT NOT NULL DEFAULT 0,
    uri             TEXT NOT NULL DEFAULT '',
    credential      TEXT NOT NULL DEFAULT '',
    ttl_seconds     BIGINT NOT NULL DEFAULT 0,
    expires_at      BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
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
    off       BIGINT NOT NULL CHECK (off >= 0),
    length    BIGINT NOT NULL CHECK (length > 0),
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
    measured_at BIGINT NOT NULL
);

-- Append-only audit log.
CREATE TABLE events (
    id      BIGSERIAL PRIMARY KEY,
    at      BIGINT NOT NULL,
    type    TEXT NOT NULL,
    subject TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    state   TEXT NOT NULL DEFAULT ''
);
CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'events are append-only'; END $$;
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
FOR EACH ROW EXECUTE FUNCTION events_append_only();
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
FOR EACH ROW EXECUTE FUNCTION events_append_only();

-- API tokens, hashed (SHA-256); the secrets are never stored.
CREATE TABLE tokens (
    hash       TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    tenant     TEXT NOT NULL DEFAULT '',
    admin      BOOLEAN NOT NULL DEFAULT FALSE,
    created_at BIGINT NOT NULL
);

CREATE TABLE idempotency_keys (
    tenant       TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    lease_id     TEXT NOT NULL REFERENCES leases(id),
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);
