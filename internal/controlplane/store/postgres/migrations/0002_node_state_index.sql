-- Liveness sweeps and metrics look nodes up by state.
CREATE INDEX nodes_by_state ON nodes (state, last_heartbeat);
