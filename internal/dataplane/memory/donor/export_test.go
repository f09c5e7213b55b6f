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
