package iperf

import (
	"context"
	"errors"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestParse reads captured iperf3 3.12 -J reports and malformed ones.
func TestParse(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		name     string
		in       []byte
		bps      float64
		err      string
		reported bool
	}{
		{name: "captured run", in: read("ok.json"), bps: 13003725552.113522},
		{name: "connection refused", in: read("refused.json"), err: "iperf3: unable to connect to server: Connection refused", reported: true},
		{name: "empty output", in: nil, err: "iperf3 output:"},
		{name: "not JSON", in: []byte("iperf3: error - the server is busy running a test\n"), err: "iperf3 output:"},
		{name: "no rate", in: []byte(`{"end":{"sum_received":{"bits_per_second":0}}}`), err: "measured nothing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bps, err := Parse(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Parse error = %v, want one containing %q", err, c.err)
				}
				var rep *ReportedError
				if errors.As(err, &rep) != c.reported {
					t.Fatalf("Parse error %v: reported by iperf3 = %v, want %v", err, !c.reported, c.reported)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(bps-c.bps) > 1e-3 {
				t.Fatalf("Parse = %v, want %v", bps, c.bps)
			}
		})
	}
}

// TestServerAndClient runs the real iperf3 on loopback for one second.
func TestServerAndClient(t *testing.T) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	port := freePort(t)
	srv, err := StartServer(ctx, Local, "127.0.0.1", port, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	bps, err := Client(ctx, Local, "127.0.0.1", port, 1)
	if err != nil {
		t.Fatal(err)
	}
	if bps <= 0 {
		t.Fatalf("Client = %v bits/s", bps)
	}
	srv.Stop()
	// Measure runs its own server and stops it.
	if bps, err := Measure(ctx, Local, Local, "127.0.0.1", port, 1, "-P", "2"); err != nil || bps <= 0 {
		t.Fatalf("Measure = %v bits/s, %v", bps, err)
	}
	// With the server gone, the client's error is the one iperf3 reports.
	_, err = Client(ctx, Local, "127.0.0.1", port, 1)
	var rep *ReportedError
	if !errors.As(err, &rep) {
		t.Fatalf("Client against no server: %v, want a ReportedError", err)
	}
}

// TestStartServerTimesOut: a command that never listens fails after the
// timeout, with its process stopped.
func TestStartServerTimesOut(t *testing.T) {
	ctx := context.Background()
	var cmd *exec.Cmd
	command := func(ctx context.Context, args ...string) *exec.Cmd {
		cmd = exec.CommandContext(ctx, "sleep", "30")
		return cmd
	}
	_, err := StartServer(ctx, command, "127.0.0.1", freePort(t), 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "not listening") {
		t.Fatalf("StartServer = %v, want a timeout", err)
	}
	if cmd.ProcessState == nil {
		t.Fatal("the server process was not waited for")
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, _ := strconv.Atoi(strings.TrimPrefix(l.Addr().String(), "127.0.0.1:"))
	return p
}

// FuzzParse: any output gives a positive rate or an error, never a panic.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"ok.json", "refused.json"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"end":{"sum_received":{"bits_per_second":-1}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		bps, err := Parse(b)
		if err == nil && !(bps > 0) {
			t.Fatalf("Parse = %v without an error", bps)
		}
	})
}
