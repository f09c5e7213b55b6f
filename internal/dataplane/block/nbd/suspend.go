package nbd

// SuspendExport stops serving export name as RemoveExport does (its
// connections are closed and waited for, and a client asking for it is
// told there is no such export) but keeps it registered, with the state
// of a move of it: once ResumeExport serves it again its writes are
// marked, held or refused as the move says, as before the suspension. A
// write the move held when the export was suspended ends with its
// connection. The move's functions (TrackWrites, PauseWrites, EndMove,
// Retire...) work on a suspended export; RemoveExport and Retire remove
// it. Suspending a suspended export does nothing.
//
// RemoveExport followed by AddExport would drop the move's state: a
// sealed move's writes would land here unheld and unmarked, and the copy
// its commit serves would not have them.
func (s *Server) SuspendExport(name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	if !ok {
		s.mu.Unlock()
		return ErrExportNotFound
	}
	e.suspended = true
	conns := e.connList()
	s.mu.Unlock()
	endConns(conns)
	s.logger().Info("nbd: export suspended", "export", NameTag(name), "connections", len(conns))
	return nil
}

// AddSuspendedExport registers an export as AddExport does, suspended
// from the start: no client opens it, not for a single request, until
// ResumeExport serves it. (AddExport then SuspendExport would serve a
// client that came in between.)
func (s *Server) AddSuspendedExport(e Export) error {
	return s.addExport(e, true)
}

// ResumeExport serves a suspended export again (an export that is not
// suspended is left as it is).
func (s *Server) ResumeExport(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.exports[name]
	if !ok {
		return ErrExportNotFound
	}
	e.suspended = false
	return nil
}
