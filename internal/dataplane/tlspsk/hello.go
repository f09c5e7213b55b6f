package tlspsk

import (
	"golang.org/x/crypto/cryptobyte"
)

// Handshake message types, extension numbers and other constants of RFC
// 8446 this server uses.
const (
	typeClientHello         = 1
	typeServerHello         = 2
	typeEncryptedExtensions = 8
	typeFinished            = 20
	typeKeyUpdate           = 24
	typeMessageHash         = 254

	extSupportedGroups    = 10
	extPreSharedKey       = 41
	extEarlyData          = 42
	extSupportedVersions  = 43
	extCookie             = 44
	extPSKKeyExchangeMode = 45
	extKeyShare           = 51

	pskModeKE    = 0
	pskModeDHEKE = 1

	versionTLS13 = 0x0304
	versionTLS12 = 0x0303
)

type keyShare struct {
	group uint16
	data  []byte
}

type pskIdentity struct {
	identity []byte
	age      uint32
}

// clientHello is a parsed ClientHello. Slices point into raw.
type clientHello struct {
	raw          []byte // the whole message, header included
	vers         uint16
	random       []byte
	sessionID    []byte
	suites       []uint16
	compression  []byte
	versions     []uint16
	groups       []uint16
	hasGroups    bool
	shares       []keyShare
	hasShares    bool
	pskModes     []uint8
	hasPSKModes  bool
	earlyData    bool
	cookie       bool
	identities   []pskIdentity
	binders      [][]byte
	hasPSK       bool
	bindersStart int // raw[:bindersStart] is the truncated ClientHello
}

// parseClientHello parses one ClientHello handshake message (header
// included), checking every length. It returns the alert a malformed one
// deserves.
func parseClientHello(msg []byte) (*clientHello, alert) {
	ch := &clientHello{raw: msg}
	s := cryptobyte.String(msg)
	var typ uint8
	var body cryptobyte.String
	if !s.ReadUint8(&typ) || typ != typeClientHello || !s.ReadUint24LengthPrefixed(&body) || !s.Empty() {
		return nil, alertDecodeError
	}
	var sid, suites, comp cryptobyte.String
	if !body.ReadUint16(&ch.vers) || !body.ReadBytes(&ch.random, 32) ||
		!body.ReadUint8LengthPrefixed(&sid) || len(sid) > 32 ||
		!body.ReadUint16LengthPrefixed(&suites) || len(suites)%2 != 0 || len(suites) == 0 ||
		!body.ReadUint8LengthPrefixed(&comp) || len(comp) == 0 {
		return nil, alertDecodeError
	}
	ch.sessionID, ch.compression = sid, comp
	for !suites.Empty() {
		var cs uint16
		suites.ReadUint16(&cs)
		ch.suites = append(ch.suites, cs)
	}
	if body.Empty() {
		return ch, alertNone // no extensions: not TLS 1.3; the caller refuses it
	}
	var exts cryptobyte.String
	if !body.ReadUint16LengthPrefixed(&exts) || !body.Empty() {
		return nil, alertDecodeError
	}
	seen := map[uint16]bool{}
	for !exts.Empty() {
		var et uint16
		var ed cryptobyte.String
		if !exts.ReadUint16(&et) || !exts.ReadUint16LengthPrefixed(&ed) {
			return nil, alertDecodeError
		}
		if seen[et] {
			return nil, alertIllegalParameter
		}
		seen[et] = true
		if ch.hasPSK {
			return nil, alertIllegalParameter // pre_shared_key must be the last extension
		}
		switch et {
		case extSupportedVersions:
			var l cryptobyte.String
			if !ed.ReadUint8LengthPrefixed(&l) || !ed.Empty() || len(l) == 0 || len(l)%2 != 0 {
				return nil, alertDecodeError
			}
			for !l.Empty() {
				var v uint16
				l.ReadUint16(&v)
				ch.versions = append(ch.versions, v)
			}
		case extSupportedGroups:
			var l cryptobyte.String
			if !ed.ReadUint16LengthPrefixed(&l) || !ed.Empty() || len(l) == 0 || len(l)%2 != 0 {
				return nil, alertDecodeError
			}
			ch.hasGroups = true
			for !l.Empty() {
				var g uint16
				l.ReadUint16(&g)
				ch.groups = append(ch.groups, g)
			}
		case extKeyShare:
			var l cryptobyte.String
			if !ed.ReadUint16LengthPrefixed(&l) || !ed.Empty() {
				return nil, alertDecodeError
			}
			ch.hasShares = true
			for !l.Empty() {
				var ks keyShare
				var d cryptobyte.String
				if !l.ReadUint16(&ks.group) || !l.ReadUint16LengthPrefixed(&d) || len(d) == 0 {
					return nil, alertDecodeError
				}
				ks.data = d
				ch.shares = append(ch.shares, ks)
			}
		case extPSKKeyExchangeMode:
			var l cryptobyte.String
			if !ed.ReadUint8LengthPrefixed(&l) || !ed.Empty() || len(l) == 0 {
				return nil, alertDecodeError
			}
			ch.hasPSKModes, ch.pskModes = true, l
		case extEarlyData:
			if !ed.Empty() {
				return nil, alertDecodeError
			}
			ch.earlyData = true
		case extCookie:
			ch.cookie = true
		case extPreSharedKey:
			var ids, binders cryptobyte.String
			if !ed.ReadUint16LengthPrefixed(&ids) || len(ids) == 0 {
				return nil, alertDecodeError
			}
			// What is left of ed is the binders list, which ends the
			// message (this is the last extension, checked below).
			ch.bindersStart = len(msg) - len(ed)
			if !ed.ReadUint16LengthPrefixed(&binders) || !ed.Empty() || len(binders) == 0 {
				return nil, alertDecodeError
			}
			for !ids.Empty() {
				var id pskIdentity
				var d cryptobyte.String
				if !ids.ReadUint16LengthPrefixed(&d) || len(d) == 0 || !ids.ReadUint32(&id.age) {
					return nil, alertDecodeError
				}
				id.identity = d
				ch.identities = append(ch.identities, id)
			}
			for !binders.Empty() {
				var b cryptobyte.String
				if !binders.ReadUint8LengthPrefixed(&b) || len(b) < 32 {
					return nil, alertDecodeError
				}
				ch.binders = append(ch.binders, b)
			}
			if len(ch.binders) != len(ch.identities) {
				return nil, alertIllegalParameter
			}
			ch.hasPSK = true
		}
	}
	if ch.hasPSK && !exts.Empty() {
		return nil, alertIllegalParameter
	}
	return ch, alertNone
}

func (ch *clientHello) offersTLS13() bool {
	for _, v := range ch.versions {
		if v == versionTLS13 {
			return true
		}
	}
	return false
}

func (ch *clientHello) offersMode(m uint8) bool {
	for _, x := range ch.pskModes {
		if x == m {
			return true
		}
	}
	return false
}

// knownIdentity returns the index of the first identity keys holds, and
// its key.
func (ch *clientHello) knownIdentity(keys *Keys) (int, []byte, bool) {
	for i, id := range ch.identities {
		if key, ok := keys.lookup(id.identity); ok {
			return i, key, true
		}
	}
	return 0, nil, false
}
