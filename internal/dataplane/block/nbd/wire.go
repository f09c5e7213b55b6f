package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Handshake magics and flags (fixed newstyle).
const (
	nbdMagic      uint64 = 0x4e42444d41474943 // "NBDMAGIC"
	optMagic      uint64 = 0x49484156454F5054 // "IHAVEOPT"
	optReplyMagic uint64 = 0x3e889045565a9

	flagFixedNewstyle uint16 = 1 << 0
	flagNoZeroes      uint16 = 1 << 1

	clientFlagFixedNewstyle uint32 = 1 << 0
	clientFlagNoZeroes      uint32 = 1 << 1
)

// Transmission flags (NBD_FLAG_*), sent with the export size.
const (
	FlagHasFlags        uint16 = 1 << 0
	FlagReadOnly        uint16 = 1 << 1
	FlagSendFlush       uint16 = 1 << 2
	FlagSendFUA         uint16 = 1 << 3
	FlagRotational      uint16 = 1 << 4
	FlagSendTrim        uint16 = 1 << 5
	FlagSendWriteZeroes uint16 = 1 << 6
	FlagSendDF          uint16 = 1 << 7
	FlagCanMultiConn    uint16 = 1 << 8
)

// Options (NBD_OPT_*).
const (
	optExportName      uint32 = 1
	optAbort           uint32 = 2
	optList            uint32 = 3
	optStartTLS        uint32 = 5
	optInfo            uint32 = 6
	optGo              uint32 = 7
	optStructuredReply uint32 = 8
	optListMetaContext uint32 = 9
	optSetMetaContext  uint32 = 10
)

// Option replies (NBD_REP_*).
const (
	repAck         uint32 = 1
	repServer      uint32 = 2
	repInfo        uint32 = 3
	repMetaContext uint32 = 4

	repErrBit          uint32 = 1 << 31
	repErrUnsup        uint32 = repErrBit | 1
	repErrPolicy       uint32 = repErrBit | 2
	repErrInvalid      uint32 = repErrBit | 3
	repErrPlatform     uint32 = repErrBit | 4
	repErrTLSReqd      uint32 = repErrBit | 5
	repErrUnknown      uint32 = repErrBit | 6
	repErrShutdown     uint32 = repErrBit | 7
	repErrBlockSizeReq uint32 = repErrBit | 8
	repErrTooBig       uint32 = repErrBit | 9
)

// Information types (NBD_INFO_*).
const (
	infoExport      uint16 = 0
	infoName        uint16 = 1
	infoDescription uint16 = 2
	infoBlockSize   uint16 = 3
)

// Transmission phase.
const (
	requestMagic         uint32 = 0x25609513
	simpleReplyMagic     uint32 = 0x67446698
	structuredReplyMagic uint32 = 0x668e33ef

	requestHeaderLen    = 28
	simpleReplyLen      = 16
	structuredHeaderLen = 20
)

// Commands (NBD_CMD_*).
const (
	CmdRead        uint16 = 0
	CmdWrite       uint16 = 1
	CmdDisc        uint16 = 2
	CmdFlush       uint16 = 3
	CmdTrim        uint16 = 4
	CmdCache       uint16 = 5
	CmdWriteZeroes uint16 = 6
	CmdBlockStatus uint16 = 7
)

// Command flags (NBD_CMD_FLAG_*).
const (
	CmdFlagFUA    uint16 = 1 << 0
	CmdFlagNoHole uint16 = 1 << 1
	CmdFlagDF     uint16 = 1 << 2
	CmdFlagReqOne uint16 = 1 << 3
)

// Structured reply chunk types and flags.
const (
	replyFlagDone uint16 = 1 << 0

	replyTypeNone        uint16 = 0
	replyTypeOffsetData  uint16 = 1
	replyTypeOffsetHole  uint16 = 2
	replyTypeBlockStatus uint16 = 5
	replyTypeError       uint16 = 1<<15 | 1
	replyTypeErrorOffset uint16 = 1<<15 | 2
)

// Error values carried in replies (NBD_E*).
const (
	EPERM     uint32 = 1
	EIO       uint32 = 5
	ENOMEM    uint32 = 12
	EINVAL    uint32 = 22
	ENOSPC    uint32 = 28
	EOVERFLOW uint32 = 75
	ENOTSUP   uint32 = 95
	ESHUTDOWN uint32 = 108
)

// base:allocation extent flags.
const (
	StateHole uint32 = 1 << 0
	StateZero uint32 = 1 << 1
)

// MetaContextBaseAllocation is the only metadata context served.
const MetaContextBaseAllocation = "base:allocation"

// Default block size constraints.
const (
	DefaultMinBlock  uint32 = 1
	DefaultPrefBlock uint32 = 4096
	DefaultMaxBlock  uint32 = 32 << 20
)

// Limits on the option phase.
const (
	maxOptionLen = 64 << 10 // the client's limit on an option reply or error chunk
	maxNameLen   = 4096     // the spec's limit on strings
	// maxOptionData bounds the option data the server holds: an export
	// name and a meta context query at the spec's limit on strings
	// (4096 bytes each) with room to spare for more queries or info
	// requests. Longer options are read past, not held, and refused with
	// NBD_REP_ERR_TOO_BIG (NBD_OPT_EXPORT_NAME, which has no error reply,
	// ends the connection past maxNameLen).
	maxOptionData = 16 << 10
	// maxOptionSkip bounds the options read past that way; longer ones
	// end the connection.
	maxOptionSkip = 1 << 20
	// handshakeReadBuf is the read buffer of a connection in its option
	// phase (and over TLS, of the TLS session's then); it becomes
	// newConnReader's 64 KiB once the client enters transmission.
	handshakeReadBuf = 4 << 10
	maxOptions       = 256     // options per connection before we hang up
	maxExtentsList   = 1 << 12 // descriptors per block-status reply
	metaContextID    = 1
)

// Sentinel errors.
var (
	ErrExportNotFound = errors.New("nbd: export not found")
	ErrExportExists   = errors.New("nbd: export already exists")
	ErrInvalidExport  = errors.New("nbd: invalid export")
	ErrClosed         = errors.New("nbd: connection closed")
	ErrTimeout        = errors.New("nbd: request timed out")
	ErrProtocol       = errors.New("nbd: protocol error")
	ErrUnsupported    = errors.New("nbd: operation not supported by the export")
	// ErrBackendClosed is wrapped by the errors of a FileBackend used
	// after Close; the server answers such requests with ESHUTDOWN.
	ErrBackendClosed = errors.New("nbd: backend closed")
	// ErrShutdown is the error of a request the server answered with
	// ESHUTDOWN (it is stopping the connection: Server.Retire). It
	// matches ErrClosed: the Client fails every later request at once,
	// and Close disconnects softly.
	ErrShutdown = fmt.Errorf("nbd: the server is shutting the connection down: %w", ErrClosed)
)

// Request is a transmission-phase request header.
type Request struct {
	Flags  uint16
	Type   uint16
	Handle uint64
	Offset uint64
	Length uint32
}

// parseRequest decodes a 28-byte request header.
func parseRequest(b []byte) (Request, error) {
	if len(b) < requestHeaderLen {
		return Request{}, ErrProtocol
	}
	if binary.BigEndian.Uint32(b[0:4]) != requestMagic {
		return Request{}, ErrProtocol
	}
	return Request{
		Flags:  binary.BigEndian.Uint16(b[4:6]),
		Type:   binary.BigEndian.Uint16(b[6:8]),
		Handle: binary.BigEndian.Uint64(b[8:16]),
		Offset: binary.BigEndian.Uint64(b[16:24]),
		Length: binary.BigEndian.Uint32(b[24:28]),
	}, nil
}

func putRequest(b []byte, r Request) {
	binary.BigEndian.PutUint32(b[0:4], requestMagic)
	binary.BigEndian.PutUint16(b[4:6], r.Flags)
	binary.BigEndian.PutUint16(b[6:8], r.Type)
	binary.BigEndian.PutUint64(b[8:16], r.Handle)
	binary.BigEndian.PutUint64(b[16:24], r.Offset)
	binary.BigEndian.PutUint32(b[24:28], r.Length)
}

func putSimpleReply(b []byte, errno uint32, handle uint64) {
	binary.BigEndian.PutUint32(b[0:4], simpleReplyMagic)
	binary.BigEndian.PutUint32(b[4:8], errno)
	binary.BigEndian.PutUint64(b[8:16], handle)
}

func putChunkHeader(b []byte, flags, typ uint16, handle uint64, length uint32) {
	binary.BigEndian.PutUint32(b[0:4], structuredReplyMagic)
	binary.BigEndian.PutUint16(b[4:6], flags)
	binary.BigEndian.PutUint16(b[6:8], typ)
	binary.BigEndian.PutUint64(b[8:16], handle)
	binary.BigEndian.PutUint32(b[16:20], length)
}

// Extent is one run of a base:allocation answer: Length bytes with Flags
// (StateHole, StateZero, or 0 for allocated data).
type Extent struct {
	Length int64
	Flags  uint32
}

// Error is an NBD error reply received by a client.
type Error struct {
	Errno   uint32
	Message string
}

func (e *Error) Error() string {
	s := "nbd: server error " + errnoName(e.Errno)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

func errnoName(e uint32) string {
	switch e {
	case EPERM:
		return "EPERM"
	case EIO:
		return "EIO"
	case ENOMEM:
		return "ENOMEM"
	case EINVAL:
		return "EINVAL"
	case ENOSPC:
		return "ENOSPC"
	case EOVERFLOW:
		return "EOVERFLOW"
	case ENOTSUP:
		return "ENOTSUP"
	case ESHUTDOWN:
		return "ESHUTDOWN"
	}
	return "errno " + itoa(uint64(e))
}

func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}
