package tlspsk

import (
	"errors"
	"net"
	"strings"
	"testing"
)

// TestRefusals: each client is refused with the alert that says why, on
// both sides.
func TestRefusals(t *testing.T) {
	need(t, "gnutls-cli")
	for _, tc := range []struct {
		name, prio, user, key string
		alert                 alert
		client                string // in gnutls-cli's output
	}{
		{"wrong key", "NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK", testIdentity, strings.Repeat("ab", 32), alertDecryptError, "Received alert [51]"},
		{"unknown identity", "NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK", "mallory", testKeyHex, alertUnknownPSKIdentity, "Received alert [115]"},
		{"psk_ke only", "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+PSK", testIdentity, testKeyHex, alertInsufficientSecurity, "Received alert [71]"},
		{"TLS 1.2 only", "NORMAL:-VERS-ALL:+VERS-TLS1.2:+ECDHE-PSK", testIdentity, testKeyHex, alertProtocolVersion, "Received alert [70]"},
		// A key is used with SHA-256 only: a client offering only
		// the SHA-384 suite has none in common with the server.
		{"TLS_AES_256_GCM_SHA384 only", "NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK:-CIPHER-ALL:+AES-256-GCM", testIdentity, testKeyHex, alertHandshakeFailure, "Received alert [40]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, done := echoServer(t, testKeys(t))
			host, port, _ := net.SplitHostPort(addr)
			out, err := talk(t, "gnutls-cli", "--priority", tc.prio, "--pskusername", tc.user, "--pskkey", tc.key, "-p", port, host)
			serr := <-done
			var ae *AlertError
			if !errors.As(serr, &ae) || !ae.Sent || alert(ae.Alert) != tc.alert {
				t.Fatalf("server: %v, want sent %s\nclient: %s", serr, tc.alert, out)
			}
			if err == nil || strings.Contains(out, "echo: ping") || !strings.Contains(out, tc.client) {
				t.Fatalf("client: %v\n%s", err, out)
			}
			t.Logf("server: %v", serr)
		})
	}
}
