package iperf

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Command builds an iperf3 command with args (for example
// rack.Rack.Command(ctx, node, "iperf3", args...), or exec.CommandContext
// for the root namespace).
type Command func(ctx context.Context, args ...string) *exec.Cmd

// Local runs iperf3 in the caller's own network namespace.
func Local(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "iperf3", args...)
}

// Measure starts a server through server on addr:port (see StartServer,
// with a 10 s timeout), runs one client through client against it (see
// Client) and stops the server; it returns bits per second received.
func Measure(ctx context.Context, server, client Command, addr string, port, secs int, extra ...string) (float64, error) {
	srv, err := StartServer(ctx, server, addr, port, 10*time.Second)
	if err != nil {
		return 0, err
	}
	defer srv.Stop()
	return Client(ctx, client, addr, port, secs, extra...)
}

// Server is a running iperf3 server.
type Server struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the server's output is drained
}

// StartServer runs `iperf3 -s --forceflush -B addr -p port` through
// command and waits, until timeout passes or ctx ends, until the server
// says it listens (so it accepts connections). It reads the server's
// output rather than dialling it: iperf3 takes a probing connection for a
// test and may then reset the next client, and addr need not be reachable
// from the caller's namespace. The server is stopped on failure.
func StartServer(ctx context.Context, command Command, addr string, port int, timeout time.Duration) (*Server, error) {
	cmd := command(ctx, "-s", "--forceflush", "-B", addr, "-p", strconv.Itoa(port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("iperf3 server: %w", err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("iperf3 server: %w", err)
	}
	s := &Server{cmd: cmd, done: make(chan struct{})}
	listening := make(chan struct{})
	go func() { // owned by s: ends when the output closes (at the latest in Stop)
		defer close(s.done)
		sc := bufio.NewScanner(out)
		said := false
		for sc.Scan() {
			if !said && strings.Contains(sc.Text(), "Server listening") {
				said = true
				close(listening)
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case <-listening:
		return s, nil
	case <-s.done:
		s.Stop()
		return nil, fmt.Errorf("iperf3 server on %s: exited: %s", net.JoinHostPort(addr, strconv.Itoa(port)), strings.TrimSpace(stderr.String()))
	case <-tm.C:
		s.Stop()
		return nil, fmt.Errorf("iperf3 server on %s: not listening after %v", net.JoinHostPort(addr, strconv.Itoa(port)), timeout)
	case <-ctx.Done():
		s.Stop()
		return nil, fmt.Errorf("iperf3 server: %w", ctx.Err())
	}
}

// Stop kills the server and waits for it and for the reader of its output
// (which ends when Wait closes the pipe, even if a child kept it open). It
// may be called more than once, from one goroutine.
func (s *Server) Stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	<-s.done
}

// Client runs `iperf3 -c addr -p port -t secs -J extra...` through command
// and returns the bits per second the receiver counted (sum_received). An
// error iperf3 reports in its JSON takes precedence over its exit status.
func Client(ctx context.Context, command Command, addr string, port, secs int, extra ...string) (float64, error) {
	args := append([]string{"-c", addr, "-p", strconv.Itoa(port), "-t", strconv.Itoa(secs), "-J"}, extra...)
	out, runErr := command(ctx, args...).Output()
	bps, err := Parse(out)
	var rep *ReportedError
	switch {
	case errors.As(err, &rep):
		return 0, err
	case runErr != nil:
		return 0, fmt.Errorf("iperf3 %v: %w", args, runErr)
	case err != nil:
		return 0, err
	}
	return bps, nil
}

// ReportedError is an error iperf3 itself reported in its -J output.
type ReportedError struct{ Msg string }

func (e *ReportedError) Error() string { return "iperf3: " + e.Msg }

// Parse reads the bits per second received (end.sum_received) from iperf3
// -J output. It fails with a *ReportedError when iperf3 reported an error,
// and when the report has no positive rate.
func Parse(out []byte) (float64, error) {
	var j struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &j); err != nil {
		return 0, fmt.Errorf("iperf3 output: %w", err)
	}
	if j.Error != "" {
		return 0, &ReportedError{Msg: j.Error}
	}
	if j.End.SumReceived.BitsPerSecond <= 0 {
		return 0, errors.New("iperf3 measured nothing")
	}
	return j.End.SumReceived.BitsPerSecond, nil
}
