package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

var _ store.Broadcaster = (*Store)(nil)

// broadcastChannel is the NOTIFY channel of store.Broadcaster.
const broadcastChannel = "rialto_replicas"

// listenIdle is how long Listen waits for a message before it checks that
// its connection still answers (a connection cut off without a reset would
// otherwise wait for ever); listenCheck bounds that check.
var (
	listenIdle  = 5 * time.Second
	listenCheck = 2 * time.Second
)

// Broadcast sends msg to every replica listening (pg_notify on a pooled
// connection: delivered when it commits, in commit order).
func (s *Store) Broadcast(ctx context.Context, msg string) error {
	if _, err := s.db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, broadcastChannel, msg); err != nil {
		return wrap("broadcast", err)
	}
	return nil
}

// Listen listens on a connection of its own (LISTEN), calls ready, then
// fn for every message until ctx ends or the connection fails.
func (s *Store) Listen(ctx context.Context, ready func(), fn func(msg string)) error {
	cfg, err := pgxConfig(s.url)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "rialto-listen"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return wrap("listen", err)
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(c)
	}()
	if _, err := conn.Exec(ctx, `LISTEN `+broadcastChannel); err != nil {
		return wrap("listen", err)
	}
	ready()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenIdle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err == nil {
			fn(n.Payload)
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if wctx.Err() == nil || conn.IsClosed() {
			return wrap("listen", err)
		}
		// Quiet for listenIdle: does the connection still answer?
		cctx, cancel := context.WithTimeout(ctx, listenCheck)
		_, err = conn.Exec(cctx, `SELECT 1`)
		cancel()
		if err != nil {
			return wrap("listen", err)
		}
	}
}
