package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// ErrQMP is an error qemu answered a QMP command with, or a broken QMP
// conversation.
var ErrQMP = errors.New("vm: qmp")

// maxQMPLine bounds one QMP message (qemu's answers here are small).
const maxQMPLine = 1 << 20

// qmpMessage is one message qemu sends: the greeting, a command's return
// or error, or an asynchronous event.
type qmpMessage struct {
	Greeting *json.RawMessage `json:"QMP,omitempty"`
	Return   *json.RawMessage `json:"return,omitempty"`
	Error    *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error,omitempty"`
	Event string          `json:"event,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
	ID    *uint64         `json:"id,omitempty"`
}

// parseQMP decodes one line of the QMP stream. A message that is none of
// greeting, return, error or event is malformed.
func parseQMP(line []byte) (qmpMessage, error) {
	var m qmpMessage
	d := json.NewDecoder(bytes.NewReader(line))
	if err := d.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: malformed message: %v", ErrQMP, err)
	}
	if d.More() {
		return m, fmt.Errorf("%w: trailing data after a message", ErrQMP)
	}
	n := 0
	for _, set := range []bool{m.Greeting != nil, m.Return != nil, m.Error != nil, m.Event != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return m, fmt.Errorf("%w: a message with %d of greeting, return, error and event", ErrQMP, n)
	}
	if (m.Return != nil || m.Error != nil) && m.ID == nil {
		return m, fmt.Errorf("%w: a reply without an id", ErrQMP)
	}
	return m, nil
}

// Event is an asynchronous QMP event (SHUTDOWN, STOP, RESUME, ...).
type Event struct {
	Name string
	Data json.RawMessage
}

// QMP is a client of qemu's machine protocol on a Unix socket. Commands
// run one at a time; events go to Events. Close ends the conversation and
// waits for the reader.
type QMP struct {
	nc     net.Conn
	redact func(string) string
	events chan Event

	mu      sync.Mutex // serialises Execute
	id      uint64
	pending chan qmpMessage // the reply of the command in flight

	done chan struct{} // closed when the reader exits
	err  error         // why the reader exited; read after done
}

// DialQMP connects to qemu's QMP socket at path, reads the greeting and
// enters command mode. redact, if set, is applied to every error message
// qemu sends (which may quote what it was given, such as an NBD export
// name).
func DialQMP(ctx context.Context, path string, redact func(string) string) (*QMP, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("%w: dial: %w", ErrQMP, err)
	}
	if redact == nil {
		redact = func(s string) string { return s }
	}
	q := &QMP{nc: nc, redact: redact, events: make(chan Event, 64), pending: make(chan qmpMessage, 1), done: make(chan struct{})}
	br := bufio.NewReaderSize(nc, 64<<10)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	greet, err := readQMP(br)
	if err == nil && greet.Greeting == nil {
		err = fmt.Errorf("%w: no greeting", ErrQMP)
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	go q.reader(br)
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		_ = q.Close()
		return nil, err
	}
	return q, nil
}

func readQMP(br *bufio.Reader) (qmpMessage, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxQMPLine {
			return qmpMessage{}, fmt.Errorf("%w: message above %d bytes", ErrQMP, maxQMPLine)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return qmpMessage{}, fmt.Errorf("%w: read: %w", ErrQMP, err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			line = line[:0]
			continue
		}
		return parseQMP(line)
	}
}

func (q *QMP) reader(br *bufio.Reader) {
	defer close(q.done)
	for {
		m, err := readQMP(br)
		if err != nil {
			q.err = err
			return
		}
		if m.Event != "" {
			select {
			case q.events <- Event{Name: m.Event, Data: m.Data}:
			default: // nobody listens: drop
			}
			continue
		}
		select {
		case q.pending <- m:
		default: // a reply nobody waits for (its command gave up)
		}
	}
}

// Events delivers qemu's events; they are dropped when it is full.
func (q *QMP) Events() <-chan Event { return q.events }

// Done is closed when the conversation has ended (qemu exited, or Close).
func (q *QMP) Done() <-chan struct{} { return q.done }

// Execute runs one command and returns its "return" value.
func (q *QMP) Execute(ctx context.Context, command string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.id++
	id := q.id
	req := map[string]any{"execute": command, "id": id}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	// Drop a stale reply of a command that gave up.
	select {
	case <-q.pending:
	default:
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = q.nc.SetWriteDeadline(dl)
	} else {
		_ = q.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	}
	if _, err := q.nc.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrQMP, command, err)
	}
	for {
		select {
		case m := <-q.pending:
			if m.ID == nil || *m.ID != id {
				continue
			}
			if m.Error != nil {
				return nil, fmt.Errorf("%w: %s: %s: %s", ErrQMP, command, m.Error.Class, q.redact(m.Error.Desc))
			}
			return *m.Return, nil
		case <-q.done:
			return nil, fmt.Errorf("%w: %s: %w", ErrQMP, command, q.err)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s: %w", ErrQMP, command, ctx.Err())
		}
	}
}

// Close ends the conversation and waits for the reader.
func (q *QMP) Close() error {
	err := q.nc.Close()
	<-q.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// redactor returns a function replacing each secret in a string by
// "xxxxx".
func redactor(secrets ...string) func(string) string {
	var pairs []string
	for _, s := range secrets {
		if s != "" {
			pairs = append(pairs, s, "xxxxx")
		}
	}
	if len(pairs) == 0 {
		return func(s string) string { return s }
	}
	r := strings.NewReplacer(pairs...)
	return r.Replace
}
