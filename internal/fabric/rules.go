package fabric

import "time"

// The rules below come from two papers: the Device Lending paper (Markussen
// et al., "Flexible device compositions and dynamic resource sharing in PCIe
// interconnected clusters using Device Lending") for PCIe, and the
// network-attached FPGA paper (Weerasinghe et al., "Disaggregated FPGAs:
// Network Performance Comparison against Bare-Metal Servers, Virtual
// Machines and Linux Containers") for UDP over Ethernet.

// NTBCrossingLatency is the one-way latency a PCIe non-transparent bridge
// adds to a transaction that crosses it (the Device Lending paper measured
// 350–370 ns).
const NTBCrossingLatency = 350 * time.Nanosecond

// PCIe transaction sizes for DMA reads (the Device Lending paper): a device
// may request up to MaxReadRequest bytes per read, but a read routed through
// a CPU root complex is re-emitted as requests of RootReadCompletion bytes
// each.
const (
	MaxReadRequest     = 256
	RootReadCompletion = 64
	// TLPOverhead is the per-TLP cost on the wire in bytes: a 4-DW header
	// (16 B) plus framing, sequence number and LCRC (8 B).
	TLPOverhead = 24
)

// NTBLatency returns the one-way latency added by crossing n non-transparent
// bridges.
func NTBLatency(crossings int) time.Duration {
	if crossings <= 0 {
		return 0
	}
	return time.Duration(crossings) * NTBCrossingLatency
}

// ReadBandwidth is the effective DMA read bandwidth in bytes/s over a PCIe
// path of raw bandwidth linkBW (bytes/s) when each read request carries
// payload bytes, the requester keeps at most tags reads outstanding and a
// read takes rtt to complete. Reads are bounded both by the wire (payload
// over payload plus TLP overhead) and by the outstanding-request window
// (tags × payload per round trip). tags <= 0 or rtt <= 0 disables the window.
func ReadBandwidth(linkBW float64, payload, tags int, rtt time.Duration) float64 {
	if payload <= 0 || linkBW <= 0 {
		return 0
	}
	wire := linkBW * float64(payload) / float64(payload+TLPOverhead)
	if tags <= 0 || rtt <= 0 {
		return wire
	}
	window := float64(tags) * float64(payload) / rtt.Seconds()
	if window < wire {
		return window
	}
	return wire
}

// DirectReadBandwidth is ReadBandwidth for reads that take the shortest
// (peer-to-peer) path and keep their full MaxReadRequest size.
func DirectReadBandwidth(linkBW float64, tags int, rtt time.Duration) float64 {
	return ReadBandwidth(linkBW, MaxReadRequest, tags, rtt)
}

// RootReadBandwidth is ReadBandwidth for reads routed through a CPU root
// (for example because an IOMMU must translate them): every 256 B request is
// split into 64 B requests, so each outstanding tag moves a quarter of the
// data per round trip (the Device Lending paper, Fig. 10: reads "lose most
// bandwidth").
func RootReadBandwidth(linkBW float64, tags int, rtt time.Duration) float64 {
	return ReadBandwidth(linkBW, RootReadCompletion, tags, rtt)
}

// UDPOverhead is the per-datagram overhead on Ethernet in bytes: UDP header
// (8), IPv4 header (20), Ethernet header (14), FCS (4), preamble (7), start
// frame delimiter (1) and inter-frame gap (12) — the network-attached FPGA
// paper's formula.
const UDPOverhead = 8 + 20 + 14 + 4 + 7 + 1 + 12

// MinEthernetPayload is the smallest UDP payload that fills a minimum-size
// (64 B) Ethernet frame; smaller payloads are padded to it on the wire.
const MinEthernetPayload = 64 - 14 - 4 - 20 - 8

// UDPThroughput returns the network-attached FPGA paper's maximum UDP
// goodput in bytes/s for a payload of payload bytes on a link of lineRate
// bits/s:
// lineRate/8 × payload / (payload + 66).
func UDPThroughput(lineRate float64, payload int) float64 {
	if payload <= 0 {
		return 0
	}
	return lineRate / 8 * float64(payload) / float64(payload+UDPOverhead)
}

// UDPMessageRate returns the maximum number of UDP datagrams per second of
// payload bytes on a link of lineRate bits/s. Payloads below
// MinEthernetPayload are padded to the minimum frame, which is how 1-byte
// messages reach 14.88 M msg/s on 10 GbE (the network-attached FPGA paper).
func UDPMessageRate(lineRate float64, payload int) float64 {
	if payload < 0 {
		return 0
	}
	wire := payload
	if wire < MinEthernetPayload {
		wire = MinEthernetPayload
	}
	return lineRate / 8 / float64(wire+UDPOverhead)
}
