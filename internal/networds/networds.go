package networds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/rialto-project/rialto/internal/pki"
)

// Kind is what went wrong with a connection.
type Kind int

const (
	// Other: not a failure of the connection that Describe knows.
	Other Kind = iota
	// Unreachable: the peer could not be connected to.
	Unreachable
	// Broken: a connection to the peer failed once it was open.
	Broken
	// PeerCertificate: the peer's certificate was not accepted here.
	PeerCertificate
	// OwnCertificate: the peer did not accept this side's certificate.
	OwnCertificate
	// NotTLS: the peer answered TLS with something else.
	NotTLS
)

// Describe says what err, the failure of a connection to a peer (or of a
// call over one), is: its Kind and the words for why ("connection
// refused", "signed by an unknown authority"). Anything else is Other,
// with no words.
func Describe(err error) (Kind, string) {
	if err == nil {
		return Other, ""
	}
	// This side's verification of the peer's certificate.
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.Is(err, pki.ErrRevoked):
		return PeerCertificate, "revoked"
	case errors.Is(err, pki.ErrUntrusted):
		return PeerCertificate, "its CA was dropped"
	case errors.As(err, &unknown):
		return PeerCertificate, "signed by an unknown authority"
	case errors.As(err, &invalid):
		return PeerCertificate, invalidWords(invalid)
	case errors.As(err, &host):
		return PeerCertificate, "name mismatch: it is not for " + host.Host
	case errors.As(err, &verify):
		return PeerCertificate, "it could not be verified"
	}
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		return NotTLS, "it does not speak TLS"
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil {
		// The peer's TLS alert: crypto/tls's alert type is not exported,
		// its text is "tls: " and the alert's name.
		a := strings.TrimPrefix(op.Err.Error(), "tls: ")
		if w, ok := alertWords[a]; ok {
			return OwnCertificate, w
		}
		return Broken, "the TLS handshake failed (" + a + ")"
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		if dns.IsNotFound {
			return Unreachable, "no such host"
		}
		return Unreachable, "its name could not be looked up"
	}
	dial := op != nil && op.Op == "dial"
	kind := Broken
	if dial {
		kind = Unreachable
	}
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno) && errnoWords[errno] != "":
		if errno == syscall.ECONNREFUSED || errno == syscall.EHOSTUNREACH || errno == syscall.ENETUNREACH {
			kind = Unreachable
		}
		return kind, errnoWords[errno]
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		if op == nil {
			return Other, ""
		}
		return kind, "timed out"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		if op == nil && !errors.Is(err, net.ErrClosed) {
			return Other, "" // an EOF of anything: not a connection's for sure
		}
		return Broken, "the connection was closed"
	case dial:
		return Unreachable, "the connection failed"
	}
	return Other, ""
}

// invalidWords says why a certificate is invalid.
func invalidWords(e x509.CertificateInvalidError) string {
	switch e.Reason {
	case x509.Expired:
		// Its Detail says which: "current time … is before …" or
		// "… is after …".
		if strings.Contains(e.Detail, "is before") {
			return "not valid yet"
		}
		return "expired"
	case x509.IncompatibleUsage:
		return "not for this use"
	case x509.NotAuthorizedToSign:
		return "signed by a certificate that is not a CA's"
	}
	return "invalid"
}

// alertWords are the TLS alerts with which a peer refuses this side's
// certificate, by crypto/tls's name for them.
var alertWords = map[string]string{
	"bad certificate":               "bad certificate",
	"unsupported certificate":       "unsupported certificate",
	"revoked certificate":           "revoked",
	"expired certificate":           "expired",
	"unknown certificate":           "not accepted",
	"unknown certificate authority": "signed by an unknown authority",
	"certificate required":          "none was presented",
	"access denied":                 "access denied",
}

// errnoWords are the system's words for the errors of a connection.
var errnoWords = map[syscall.Errno]string{
	syscall.ECONNREFUSED: "connection refused",
	syscall.EHOSTUNREACH: "no route to host",
	syscall.ENETUNREACH:  "network is unreachable",
	syscall.ETIMEDOUT:    "timed out",
	syscall.ECONNRESET:   "connection reset",
	syscall.EPIPE:        "the connection was closed",
	syscall.ECONNABORTED: "connection aborted",
}
