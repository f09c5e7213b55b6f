package memorytest

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// Move moves the region of Credential from donor from to donor to, the
// way a lender-to-lender move ends (docs/operations.md, "Moving leases and
// draining nodes"): from holds the borrower's WRITEs (reads go on), the
// region is copied to a new region of to under newCred over the memory
// protocol, switched runs (the control plane points the lease at the new
// place: the borrower's relocation finds it from then on), and from
// retires the region (the held WRITEs, and any later one, are answered
// GONE, its session's connections close). The copy is the whole region
// in one pass: the writes are held all along. As an agent's move does,
// the copy goes to a region received under a credential of the move's
// own (donor.ReceiveRegion), served under newCred once complete
// (ActivateRegion), and carries the region's generation there
// (protocol.MoveGeneration): the moved region keeps it.
func Move(ctx context.Context, from, to *Donor, newCred string, switched func()) error {
	size, err := from.D.RegionSize(Credential)
	if err != nil {
		return err
	}
	gen, err := from.D.RegionGeneration(Credential)
	if err != nil {
		return err
	}
	if err := from.D.PauseWrites(ctx, Credential); err != nil {
		return err
	}
	data := make([]byte, size)
	if _, err := from.D.ReadRegion(Credential, data, 0); err != nil {
		return err
	}
	if err := to.D.ReceiveRegion(moveToken, size); err != nil {
		return err
	}
	if err := writeRegion(ctx, to.Addr, moveToken, to.ClientTLS, data, gen); err != nil {
		return fmt.Errorf("memorytest: copy: %w", err)
	}
	if err := to.D.ActivateRegion(moveToken, newCred); err != nil {
		return err
	}
	switched()
	return from.D.RetireRegion(ctx, Credential)
}

// moveToken is the credential Move's destination receives the region
// under.
const moveToken = "memorytest-move-token"

// writeRegion writes data at offset 0 of the region of credential at
// addr: a session of its own (a control connection, a sync one), closed
// after; inside TLS with tlsCfg if it is set. Its control HELLO carries
// moveGen (protocol.MoveGeneration).
func writeRegion(ctx context.Context, addr, credential string, tlsCfg *tls.Config, data []byte, moveGen uint64) error {
	var d net.Dialer
	hello := func(kind uint8, session, moveGen uint64) (net.Conn, uint64, error) {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, 0, err
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if tlsCfg != nil {
			cfg := tlsCfg.Clone()
			if cfg.ServerName == "" {
				cfg.ServerName, _, _ = net.SplitHostPort(addr)
			}
			tc := tls.Client(c, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, 0, err
			}
			c = tc
		}
		m := protocol.Hello{Kind: kind, Session: session, Credential: credential}
		b := m.Encode(make([]byte, protocol.HeaderSize))
		h := protocol.Header{Op: protocol.OpHello, Payload: uint32(len(b) - protocol.HeaderSize), Offset: moveGen}
		h.Encode(b)
		if _, err := c.Write(b); err != nil {
			c.Close()
			return nil, 0, err
		}
		var hdr [protocol.HeaderSize]byte
		f, err := protocol.ReadFrame(c, hdr[:], nil)
		if err == nil && f.Status != protocol.StatusOK {
			err = protocol.StatusError(f.Status, f.Data)
		}
		if err != nil {
			c.Close()
			return nil, 0, err
		}
		return c, binary.BigEndian.Uint64(f.Data), nil
	}
	ctrl, session, err := hello(protocol.KindControl, 0, moveGen)
	if err != nil {
		return err
	}
	defer ctrl.Close()
	c, _, err := hello(protocol.KindSync, session, 0)
	if err != nil {
		return err
	}
	defer c.Close()
	var hdr [protocol.HeaderSize]byte
	for off, seq := 0, uint32(1); off < len(data); seq++ {
		n := min(len(data)-off, protocol.MaxPayload)
		h := protocol.Header{Op: protocol.OpWrite, Seq: seq, Offset: uint64(off), Length: uint32(n), Payload: uint32(n)}
		h.Encode(hdr[:])
		if _, err := (&net.Buffers{hdr[:], data[off : off+n]}).WriteTo(c); err != nil {
			return err
		}
		f, err := protocol.ReadFrame(c, hdr[:], nil)
		if err == nil && f.Status != protocol.StatusOK {
			err = protocol.StatusError(f.Status, f.Data)
		}
		if err != nil {
			return err
		}
		off += n
	}
	return nil
}
