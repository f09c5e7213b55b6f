package tlspsk

import "fmt"

// alert is a TLS alert description (RFC 8446, 6).
type alert uint8

const (
	alertCloseNotify          alert = 0
	alertUnexpectedMessage    alert = 10
	alertBadRecordMAC         alert = 20
	alertRecordOverflow       alert = 22
	alertHandshakeFailure     alert = 40
	alertIllegalParameter     alert = 47
	alertDecodeError          alert = 50
	alertDecryptError         alert = 51
	alertProtocolVersion      alert = 70
	alertInsufficientSecurity alert = 71
	alertInternalError        alert = 80
	alertUserCanceled         alert = 90
	alertMissingExtension     alert = 109
	alertUnknownPSKIdentity   alert = 115
	alertNone                 alert = 255 // not an alert: no error
)

var alertNames = map[alert]string{
	alertCloseNotify:          "close_notify",
	alertUnexpectedMessage:    "unexpected_message",
	alertBadRecordMAC:         "bad_record_mac",
	alertRecordOverflow:       "record_overflow",
	alertHandshakeFailure:     "handshake_failure",
	alertIllegalParameter:     "illegal_parameter",
	alertDecodeError:          "decode_error",
	alertDecryptError:         "decrypt_error",
	alertProtocolVersion:      "protocol_version",
	alertInsufficientSecurity: "insufficient_security",
	alertInternalError:        "internal_error",
	alertUserCanceled:         "user_canceled",
	alertMissingExtension:     "missing_extension",
	alertUnknownPSKIdentity:   "unknown_psk_identity",
}

// level is the alert's level: warning (1) for closure alerts, fatal (2)
// for the others (RFC 8446, 6).
func (a alert) level() uint8 {
	if a == alertCloseNotify || a == alertUserCanceled {
		return 1
	}
	return 2
}

func (a alert) String() string {
	if s, ok := alertNames[a]; ok {
		return s
	}
	return fmt.Sprintf("alert(%d)", uint8(a))
}

// AlertError is a handshake or record failure: the alert sent to the
// peer (Sent) or received from it, and why.
type AlertError struct {
	Alert  uint8
	Sent   bool
	Reason string
}

func (e *AlertError) Error() string {
	if e.Sent {
		return fmt.Sprintf("tlspsk: %s (sent %s)", e.Reason, alert(e.Alert))
	}
	return fmt.Sprintf("tlspsk: remote error: %s", alert(e.Alert))
}
