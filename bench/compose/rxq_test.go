package main

import (
	"os"
	"strings"
	"testing"
)

func TestParseRxq(t *testing.T) {
	listing, err := os.ReadFile("testdata/proc-net-tcp.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		in   string
		port int
		want int64
		err  bool
	}{
		// 0x80BB = 32955: two established server sockets (0x8BF5D4 + 0x400);
		// the listener, the client end (local port 0xC48A) and other ports
		// do not count.
		{name: "server sockets", in: string(listing), port: 0x80BB, want: 0x8BF5D4 + 0x400},
		{name: "client end", in: string(listing), port: 0xC48A, want: 0x10},
		{name: "not established", in: string(listing), port: 0x80BC, want: 0},
		{name: "absent", in: string(listing), port: 1, want: 0},
		{name: "header only", in: strings.SplitN(string(listing), "\n", 2)[0], port: 0x80BB, want: 0},
		{name: "short line", in: "header\n 0: 0100007F:80BB\n", port: 0x80BB, err: true},
		{name: "bad port", in: "header\n 0: 0100007F:XYZ 0:0 01 0:0\n", port: 0x80BB, err: true},
		{name: "bad queue", in: "header\n 0: 0100007F:80BB 0:0 01 00000000:ZZ\n", port: 0x80BB, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRxq(strings.NewReader(tc.in), tc.port)
			if tc.err {
				if err == nil {
					t.Fatalf("parseRxq = %d, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("parseRxq = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestAttachPort(t *testing.T) {
	for uri, want := range map[string]int{
		"nbd://127.0.0.1:32955/abc":   32955,
		"nbd://[::1]:10809/x":         10809,
		"nbd+unix:///x?socket=/tmp/s": 0,
		"::not a uri":                 0,
	} {
		if got := attachPort(uri); got != want {
			t.Errorf("attachPort(%q) = %d, want %d", uri, got, want)
		}
	}
}
