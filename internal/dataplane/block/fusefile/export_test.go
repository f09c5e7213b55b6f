package fusefile

import "time"

// SetAfterBusy calls f after each unmount m refuses as busy.
func SetAfterBusy(m *Mount, f func()) { m.afterBusy = f }

// SetBusyGrace sets how long m's Unmount tries again a busy unmount.
func SetBusyGrace(m *Mount, d time.Duration) { m.busyGrace = d }
