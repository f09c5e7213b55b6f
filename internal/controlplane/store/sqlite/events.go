package sqlite

import (
	"context"
	"fmt"
)

// LastEventID returns the greatest event ID (0 for an empty log): where a
// tail of the log (the event stream) starts.
func (s *Store) LastEventID(ctx context.Context) (int64, error) {
	var id int64
	if err := s.rd().QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM events`).Scan(&id); err != nil {
		return 0, fmt.Errorf("sqlite: last event id: %w", err)
	}
	return id, nil
}
