package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Election timing: a replica that does not lead tries to take the lock
// every campaignEvery; the leader checks its session every checkEvery and
// gives up leading when a check fails or takes longer than checkTimeout.
// A leader that dies loses its session at once (its socket closes); one
// cut off from the database is dropped by PostgreSQL after the session's
// TCP keepalives fail (about 4 s, set below). Either way another replica
// leads within campaignEvery of the lock's release.
var (
	campaignEvery = 500 * time.Millisecond
	checkEvery    = 500 * time.Millisecond
	checkTimeout  = 1500 * time.Millisecond
)

func pgxConfig(url string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx's error quotes the URL with its password redacted.
		return nil, fmt.Errorf("postgres: bad database URL (postgres://USER:PASSWORD@HOST:PORT/DB): %w", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 3 * time.Second
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = "rialto"
	return cfg, nil
}

// Campaign blocks until this replica holds the leader lock (a
// session-level advisory lock on a connection of its own) or ctx ends.
// The returned context ends when the leadership is lost: the session
// failed a check, or ctx ended. resign releases the lock and closes the
// connection; call it once leading is over.
func (s *Store) Campaign(ctx context.Context) (context.Context, func(), error) {
	return s.CampaignAdvertising(ctx, "")
}

// CampaignAdvertising is Campaign that, once elected, also records url
// (this replica's API address; "" records nothing) as the leader's, on
// the session that holds the lock: LeaderURL returns it while that
// session lives (leader.go).
func (s *Store) CampaignAdvertising(ctx context.Context, url string) (context.Context, func(), error) {
	cfg, err := pgxConfig(s.url)
	if err != nil {
		return nil, nil, err
	}
	// PostgreSQL drops the session (and the lock) of a leader it cannot
	// reach after its keepalives fail.
	cfg.RuntimeParams["tcp_keepalives_idle"] = "2"
	cfg.RuntimeParams["tcp_keepalives_interval"] = "1"
	cfg.RuntimeParams["tcp_keepalives_count"] = "2"
	cfg.RuntimeParams["application_name"] = "rialto-leader"
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-t.C:
		}
		t.Reset(campaignEvery)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			continue // the database is away: try again
		}
		var got bool
		for err == nil && !got {
			err = conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, lockClass, lockLeader).Scan(&got)
			if err == nil && !got {
				select {
				case <-ctx.Done():
					err = ctx.Err()
				case <-t.C:
					t.Reset(campaignEvery)
				}
			}
		}
		if err != nil {
			conn.Close(context.Background())
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			continue
		}
		if url != "" {
			// A replica that cannot advertise still leads: the others then
			// place for themselves until it can (leader.go).
			_ = advertise(ctx, conn, url)
		}
		lead, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { // owned by resign, which cancels and waits for it
			defer close(done)
			watch(lead, cancel, conn)
		}()
		resign := func() {
			cancel()
			<-done
		}
		return lead, resign, nil
	}
}

// watch checks the leader's session until lead ends or a check fails,
// then cancels lead, releases the lock (if the session still answers)
// and closes the connection.
func watch(lead context.Context, cancel context.CancelFunc, conn *pgx.Conn) {
	defer cancel()
	defer func() {
		ctx, c := context.WithTimeout(context.Background(), time.Second)
		defer c()
		conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, lockClass, lockLeader)
		conn.Close(ctx)
	}()
	t := time.NewTicker(checkEvery)
	defer t.Stop()
	for {
		select {
		case <-lead.Done():
			return
		case <-t.C:
		}
		ctx, c := context.WithTimeout(lead, checkTimeout)
		var held bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
			AND classid = $1 AND objid = $2 AND granted)`, lockClass, lockLeader).Scan(&held)
		c()
		if err != nil || !held {
			return
		}
	}
}
