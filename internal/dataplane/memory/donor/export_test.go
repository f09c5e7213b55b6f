package donor

// RawFds returns the descriptors of the connections the donor serves with
// raw syscalls (sync connections, bulk streams, fault connections).
func (d *Donor) RawFds() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	var fds []int
	for conn := range d.conns {
		if dc, ok := conn.(detachedConn); ok {
			fds = append(fds, dc.p.Fd())
		}
	}
	return fds
}

// SetMoved has f called (before Serve) as a raw connection's waits move
// to the netpoller (parked) and back, from its serving goroutine, with its
// descriptor (rawconn.Idle.Moved): a test may send requests then.
func (d *Donor) SetMoved(f func(fd int, parked bool)) { d.moved = f }
