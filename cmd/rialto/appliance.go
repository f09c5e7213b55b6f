package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "appliance", Summary: "Run a standalone accelerator appliance: join a control plane and lend its slots.", Flags: runAppliance})
}

// runAppliance is an agent that lends only accelerator slots: it joins
// like an agent (boot, register, heartbeat with health), and its slots each
// listen on a port of their own and load the role a lease asks for. It
// also serves the appliance's management API (list slots, load, unload,
// reset, stats; and its shared gateways) on --management, loopback by
// default, behind a bearer token kept in --management-token-file.
func runAppliance(e *env, fs *pflag.FlagSet) runFunc {
	host, _ := os.Hostname()
	cp, bootS, caCert := joinFlags(fs, e)
	name := fs.String("name", host+"-appliance", "node name, unique in the cluster")
	stateDir := fs.String("state-dir", "rialto-appliance", "identity and export state")
	slots := fs.Int("slots", 4, "accelerator slots (each listens on its own port)")
	slotMem := sizeString(fs, "slot-memory", "16MiB", "memory of each slot (an offset table keeps slots apart)")
	listen := fs.String("listen", "127.0.0.1", "host the management API and slots bind to (0.0.0.0 needs --advertise)")
	advertise := fs.String("advertise", "", "host put into URLs (default: --listen)")
	port := fs.Int("port", 0, "agent API port, used by the control plane (0: as before, or free)")
	mgmt := fs.String("management", "127.0.0.1:0", "address of the appliance management API (\"off\": none)")
	tokFile := fs.String("management-token-file", "", "file holding the management API's bearer token, created if absent (default: STATE-DIR/management.token; env RIALTO_APPLIANCE_TOKEN overrides)")
	var labels listFlag
	fs.Var(&labels, "label", "node label KEY=VALUE (repeatable)")
	hb := fs.Duration("heartbeat", 0, "heartbeat interval (default: the control plane's)")
	machine := fs.String("machine-id", "", "override the hardware identity")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	insecure := insecureDataplaneFlag(fs)
	return func(ctx context.Context, _ []string) error {
		boot, err := bootstrapToken(bootS)
		if err != nil {
			return err
		}
		if err := checkDataplaneTLS(*caCert, *insecure); err != nil {
			return err
		}
		if *slots < 1 {
			return usagef("--slots must be at least 1")
		}
		if n, err := resource.ParseSize(*slotMem); err != nil || n <= 0 {
			return usagef("bad --slot-memory %q", *slotMem)
		}
		log, err := newLogger(e, *level)
		if err != nil {
			return err
		}
		drv := agent.NewAccelDriver(log.With("appliance", *name), *listen)
		var mln net.Listener
		if *mgmt != "off" && *mgmt != "" {
			tok, where, err := managementToken(e, *stateDir, *tokFile)
			if err != nil {
				return err
			}
			drv.ManagementToken = tok
			if mln, err = net.Listen("tcp", *mgmt); err != nil {
				return fmt.Errorf("--management: %w", err)
			}
			defer mln.Close()
			fmt.Fprintf(e.stdout, "rialto appliance: management API on http://%s (bearer token in %s)\n", mln.Addr(), where)
		}
		cfg := agent.Config{
			ControlPlane: *cp, BootstrapToken: boot, Name: *name, StateDir: *stateDir,
			Listen: *listen, Advertise: *advertise, APIPort: *port, HeartbeatInterval: *hb,
			MachineID: *machine, Logger: log.With("appliance", *name),
			Devices: []agent.DeviceConfig{{Name: "accel0", Kind: api.KindAccel, Size: int64(*slots), Model: "rialto-appliance", Sharing: "partitionable",
				Attributes: map[string]string{"slot_memory": *slotMem}}},
		}
		if cfg.Labels, err = parseLabels(labels); err != nil {
			return err
		}
		cfg.CAFile, cfg.InsecureDataplane = *caCert, *insecure
		if cfg.Labels == nil {
			cfg.Labels = map[string]string{}
		}
		if _, ok := cfg.Labels["role"]; !ok {
			cfg.Labels["role"] = "appliance"
		}
		cfg.Drivers = map[api.Kind]agent.Driver{api.KindAccel: drv}
		a, err := agent.New(cfg)
		if err != nil {
			return err
		}
		if mln == nil {
			return a.Run(ctx)
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		hs := &http.Server{Handler: managementHandler(drv, "accel0", drv.ManagementToken), ReadHeaderTimeout: 10 * time.Second}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := hs.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("management API stopped", "err", err)
			}
		}()
		go func() {
			defer wg.Done()
			<-ctx.Done()
			sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer c()
			_ = hs.Shutdown(sctx)
		}()
		err = a.Run(ctx)
		cancel()
		wg.Wait()
		return err
	}
}

// managementToken returns the management API's bearer token: the
// RIALTO_APPLIANCE_TOKEN variable, else the token file's content, else a
// new random token written to the token file (mode 0600). where says
// which, for the operator; the token itself is never printed.
func managementToken(e *env, stateDir, file string) (tok, where string, err error) {
	if t := strings.TrimSpace(e.getenv("RIALTO_APPLIANCE_TOKEN")); t != "" {
		return t, "$RIALTO_APPLIANCE_TOKEN", nil
	}
	if file == "" {
		file = filepath.Join(stateDir, "management.token")
	}
	if b, err := readSecretFile(file); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, file, nil
		}
		return "", "", fmt.Errorf("management token file %s is empty", file)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("management token: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return "", "", fmt.Errorf("management token: %w", err)
	}
	tok = resource.NewSecret("rat")
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", "", fmt.Errorf("management token: %w", err)
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return "", "", fmt.Errorf("management token: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", "", fmt.Errorf("management token: %w", err)
	}
	return tok, file, nil
}

// managementHandler serves the appliance's management API
// (appliance.Handler: slots, roles, reset, stats, metrics, HTTP calls) and
// GET /v1/gateways, the shared gateways the appliance runs for shared
// leases. Every path but the lease-credential calls needs the token.
func managementHandler(drv *agent.AccelDriver, device, token string) http.Handler {
	var mu sync.Mutex
	var app *appliance.Appliance
	var h http.Handler
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/gateways" {
			tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(token)) != 1 {
				httpx.WriteError(w, http.StatusUnauthorized, httpx.CodeUnauthorized, "appliance: management token required")
				return
			}
			httpx.WriteJSON(w, http.StatusOK, drv.Gateways())
			return
		}
		a := drv.Appliance(device)
		if a == nil {
			httpx.WriteError(w, http.StatusServiceUnavailable, "starting", "appliance: not started yet")
			return
		}
		mu.Lock()
		if a != app {
			app, h = a, a.Handler()
		}
		hh := h
		mu.Unlock()
		hh.ServeHTTP(w, r)
	})
}
