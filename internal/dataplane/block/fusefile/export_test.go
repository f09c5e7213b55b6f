package fusefile

// SetAfterBusy calls f after each unmount m refuses as busy.
func SetAfterBusy(m *Mount, f func()) { m.afterBusy = f }
