package agent

import (
	"context"
	"net"

	"github.com/rialto-project/rialto/api"
)

// Export is one prepared export: the control plane's request, the local
// device it uses and the endpoint ("host:port") of the kind's data plane.
type Export struct {
	Request  api.PrepareRequest
	Device   DeviceConfig
	Endpoint string
}

// Driver prepares and tears down exports of one resource kind. Prepare must
// be idempotent for the same export name; Teardown of an unknown export is
// not an error.
type Driver interface {
	Prepare(ctx context.Context, e Export) (api.PrepareResponse, error)
	Teardown(ctx context.Context, e Export) error
}

// Server is implemented by drivers with a data plane of their own: the
// agent opens a listener for the kind and runs Serve on it until ctx is
// cancelled. Its address is the kind's endpoint.
type Server interface {
	Serve(ctx context.Context, ln net.Listener) error
}

// Opener is implemented by drivers that set up a device before it is
// lent (for instance creating a sparse backing file).
type Opener interface {
	Open(ctx context.Context, dev DeviceConfig) (DeviceConfig, error)
}

// Closer is implemented by drivers holding resources after Run ends.
type Closer interface {
	Close() error
}
