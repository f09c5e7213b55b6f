package sqlite

import (
	"sync"

	"github.com/rialto-project/rialto/api"
)

// liveCache keeps the committed value of live leases, so that a
// transition need not read its lease back: it updates the row and applies
// the same change to the cached value. Only lease writes (under
// Store.leaseMu, after their transaction committed) change it; a lease
// not in it is read back from the row.
type liveCache struct {
	mu sync.Mutex
	m  map[string]api.Lease
}

const maxLiveCached = 1 << 16

// lookup returns the value of lease id as a batch sees it: its last write
// in the batch (staged), else the cache.
func (c *liveCache) lookup(id string, staged []api.Lease) *api.Lease {
	for i := len(staged) - 1; i >= 0; i-- {
		if staged[i].ID == id {
			return &staged[i]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.m[id]; ok {
		return &l
	}
	return nil
}

// update records committed values; ended leases leave the cache.
func (c *liveCache) update(ls []api.Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]api.Lease{}
	}
	for _, l := range ls {
		if l.State.Terminal() {
			delete(c.m, l.ID)
		} else if _, ok := c.m[l.ID]; ok || len(c.m) < maxLiveCached {
			c.m[l.ID] = l
		}
	}
}

func (c *liveCache) drop(id string) {
	c.mu.Lock()
	delete(c.m, id)
	c.mu.Unlock()
}
