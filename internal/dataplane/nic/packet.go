package nic

import (
	"encoding/binary"
	"net/netip"
)

// ipv4 returns the source and destination of an IPv4 packet and whether pkt
// is one (version 4, a sane header length, a total length equal to len(pkt)).
func ipv4(pkt []byte) (src, dst netip.Addr, ok bool) {
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return src, dst, false
	}
	ihl := int(pkt[0]&0x0f) * 4
	if ihl < 20 || ihl > len(pkt) || int(binary.BigEndian.Uint16(pkt[2:])) != len(pkt) {
		return src, dst, false
	}
	return netip.AddrFrom4([4]byte(pkt[12:16])), netip.AddrFrom4([4]byte(pkt[16:20])), true
}

// flowHash hashes a packet's flow: addresses and protocol, and the ports of
// TCP, UDP, SCTP and DCCP packets that are not later fragments. Both
// directions of a flow do not hash alike (they need not: each end hashes
// what it sends).
func flowHash(pkt []byte) uint32 {
	if len(pkt) < 20 {
		return 0
	}
	h := uint64(14695981039346656037)
	mix := func(b []byte) {
		for _, c := range b {
			h ^= uint64(c)
			h *= 1099511628211
		}
	}
	mix(pkt[12:20]) // source and destination
	mix(pkt[9:10])  // protocol
	ihl := int(pkt[0]&0x0f) * 4
	frag := binary.BigEndian.Uint16(pkt[6:]) & 0x1fff
	switch pkt[9] {
	case 6, 17, 33, 132:
		if frag == 0 && len(pkt) >= ihl+4 {
			mix(pkt[ihl : ihl+4])
		}
	}
	return uint32(h ^ h>>32)
}
