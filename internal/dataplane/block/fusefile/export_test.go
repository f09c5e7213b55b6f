package fusefile

import "time"

// SetAfterBusy calls f after each unmount m refuses as busy.
func SetAfterBusy(m *Mount, f func()) { m.afterBusy = f }

// SetBusyGrace sets how long m's Unmount tries again a busy unmount.
func SetBusyGrace(m *Mount, d time.Duration) { m.busyGrace = d }

// SetBusyWait sets the wait between m's Unmount's tries of a busy unmount.
func SetBusyWait(m *Mount, d time.Duration) { m.busyWait = d }
