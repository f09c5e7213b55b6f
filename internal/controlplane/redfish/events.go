package redfish

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
)

// sse serves EventService's ServerSentEventUri: the control plane's event
// stream (GET /v1/events?follow=1, the caller's view of it), each event
// as a Redfish Event. A new connection starts with the next event; one
// with Last-Event-ID resumes after that event, with no gap.
func (s *Service) sse(w http.ResponseWriter, r *http.Request, c *caller) {
	since := "end"
	if v := strings.TrimSpace(r.Header.Get("Last-Event-ID")); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
			writeError(w, errBadRequest("HeaderInvalid", "Last-Event-ID must be an event ID"))
			return
		}
		since = v
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, apiBase+"/v1/events?follow=1&format=ndjson&since="+since, nil)
	if err != nil {
		writeError(w, err)
		return
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := s.hc.Do(req)
	if err != nil {
		writeError(w, &rfError{status: http.StatusServiceUnavailable, id: "ServiceTemporarilyUnavailable", msg: "the event stream is unavailable"})
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// A body that is not the API's gets the code of its status.
		writeError(w, api.ErrorOf(resp))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("OData-Version", "4.0")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if _, err := w.Write([]byte("retry: 1000\n\n")); err != nil || rc.Flush() != nil {
		return
	}
	br := bufio.NewReader(resp.Body)
	var buf bytes.Buffer
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		buf.Reset()
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			buf.WriteString(": keep-alive\n\n")
		} else {
			var ev api.Event
			if json.Unmarshal(line, &ev) != nil {
				return
			}
			b, _ := json.Marshal(redfishEvent(ev))
			fmt.Fprintf(&buf, "id: %d\ndata: %s\n\n", ev.ID, b)
		}
		rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(buf.Bytes()); err != nil || rc.Flush() != nil {
			return
		}
	}
}

// redfishEvent is a Rialto event as a Redfish Event (one record).
func redfishEvent(ev api.Event) obj {
	id := strconv.FormatInt(ev.ID, 10)
	msgID := "ResourceEvent.1.3.ResourceChanged"
	sev := "OK"
	switch {
	case ev.Type == "lease.active" || ev.Type == "node.joined":
		msgID = "ResourceEvent.1.3.ResourceCreated"
	case ev.Type == "lease.released" || ev.Type == "lease.expired":
		msgID = "ResourceEvent.1.3.ResourceRemoved"
	case ev.Type == "lease.failed" || ev.Type == "lease.lost" || ev.Type == "node.down":
		msgID, sev = "ResourceEvent.1.3.ResourceStatusChangedCritical", "Critical"
	case ev.Type == "node.suspect":
		msgID, sev = "ResourceEvent.1.3.ResourceStatusChangedWarning", "Warning"
	}
	msg := ev.Type + " " + ev.Subject
	if ev.Message != "" {
		msg += ": " + ev.Message
	}
	rec := obj{
		"EventId":         id,
		"EventTimestamp":  ev.At.UTC().Format(time.RFC3339Nano),
		"MessageId":       msgID,
		"Message":         msg,
		"MessageArgs":     []string{},
		"Severity":        sev,
		"MessageSeverity": sev,
		"MemberId":        "0",
		"Oem":             obj{"Rialto": obj{"Type": ev.Type, "Subject": ev.Subject, "State": ev.State, "Id": ev.ID}},
	}
	switch {
	case strings.HasPrefix(ev.Type, "lease."):
		rec["OriginOfCondition"] = link(systemPath(ev.Subject))
	case strings.HasPrefix(ev.Type, "node."):
		rec["OriginOfCondition"] = link(pChassis + "/" + ev.Subject)
	}
	return obj{
		"@odata.type": typeOf("Event"),
		"Id":          id,
		"Name":        "Rialto event " + id,
		"Context":     "rialto",
		"Events":      []obj{rec},
	}
}
