package api

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Cursor is a position in the lease listing, whose order is creation
// time, then ID: GET /v1/leases?after= returns the leases after it
// (docs/api.md, "Paging"). Its text form is "<created_at in Unix
// nanoseconds>.<lease ID>".
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// LeaseCursor is the cursor of l: a page that ends with l continues
// after it.
func LeaseCursor(l Lease) Cursor { return Cursor{CreatedAt: l.CreatedAt, ID: l.ID} }

// IsZero reports whether c is the start of the listing.
func (c Cursor) IsZero() bool { return c.ID == "" && c.CreatedAt.IsZero() }

// String is c's text form, for ?after=.
func (c Cursor) String() string {
	if c.IsZero() {
		return ""
	}
	return strconv.FormatInt(c.CreatedAt.UnixNano(), 10) + "." + c.ID
}

// ParseCursor reads a cursor's text form ("" is the start).
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	t, id, ok := strings.Cut(s, ".")
	n, err := strconv.ParseInt(t, 10, 64)
	if !ok || err != nil || id == "" || len(id) > 256 {
		return Cursor{}, errors.New("a cursor is <unix nanoseconds>.<lease id>, as the Link header or api.LeaseCursor gives it")
	}
	return Cursor{CreatedAt: time.Unix(0, n).UTC(), ID: id}, nil
}
