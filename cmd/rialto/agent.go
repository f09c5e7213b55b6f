package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
	"github.com/rialto-project/rialto/internal/dataplane/tlspsk"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "agent", Summary: "Run a node agent: join a control plane and lend this host's devices.", Flags: runAgent})
}

// parseNIC parses --nic NAME=IFACE[:RATE]; the device's size is the rate
// in bytes/s.
func parseNIC(s string) (agent.DeviceConfig, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" || rest == "" {
		return agent.DeviceConfig{}, usagef("bad --nic %q: want NAME=IFACE[:RATE]", s)
	}
	iface, r, hasRate := strings.Cut(rest, ":")
	bps := nic.LinkSpeed(iface)
	if hasRate {
		var err error
		if bps, err = nic.ParseRate(r); err != nil {
			// The CLI's rates too: 500MB/s, 1Gbit/s.
			v, rerr := parseRate(r)
			if rerr != nil || v <= 0 {
				return agent.DeviceConfig{}, usagef("bad --nic %q: %w", s, err)
			}
			bps = uint64(v * 8)
		}
	}
	if bps == 0 {
		bps = 1e9
	}
	return agent.DeviceConfig{Name: name, Kind: api.KindNIC, Path: iface, Size: int64(bps / 8), Model: "lent-nic"}, nil
}

// parseBlock parses --block [NAME=]PATH[:SIZE].
func parseBlock(s string, i int) (agent.DeviceConfig, error) {
	d := agent.DeviceConfig{Kind: api.KindBlock, Name: fmt.Sprintf("disk%d", i)}
	if name, rest, ok := strings.Cut(s, "="); ok {
		d.Name, s = name, rest
	}
	if i := strings.LastIndex(s, ":"); i >= 0 {
		n, err := resource.ParseSize(s[i+1:])
		if err != nil {
			return d, usagef("bad --block %q: %w", s, err)
		}
		d.Size, s = n, s[:i]
	}
	if s == "" || d.Name == "" {
		return d, usagef("bad --block: want [NAME=]PATH[:SIZE]")
	}
	d.Path = s
	return d, nil
}

func parseLabels(ls []string) (map[string]string, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, l := range ls {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, usagef("bad --label %q: want KEY=VALUE", l)
		}
		m[k] = v
	}
	return m, nil
}

func newLogger(e *env, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("bad --log-level %q (debug, info, warn, error)", level)
	}
	return slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: lv})), nil
}

// joinFlags registers the flags an agent or appliance joins the cluster
// with: the control plane's URL, the bootstrap token and the CA
// certificate the control plane's HTTPS certificate verifies against.
func joinFlags(fs *pflag.FlagSet, e *env) (controlPlane *string, bootstrapToken *secret, caCert *string) {
	controlPlane = new(string)
	addrFlag(fs, e, controlPlane)
	// --control-plane was the agent's and appliance's name for --addr.
	fs.StringVar(controlPlane, "control-plane", *controlPlane, "")
	fs.MarkDeprecated("control-plane", "use --addr")
	bootstrapToken = secretFile(fs, e, "bootstrap-token", "RIALTO_BOOTSTRAP_TOKEN", "the bootstrap token")
	caCert = fs.String("cacert", e.getenv("RIALTO_CACERT"), "the cluster CA's certificate `file` (ca-cert.pem) to verify the control plane against (env RIALTO_CACERT; default: the system's CAs)")
	return controlPlane, bootstrapToken, caCert
}

// bootstrapToken returns the bootstrap token an agent or appliance joins
// with.
func bootstrapToken(s *secret) (string, error) {
	tok, err := s.get()
	if err != nil {
		return "", err
	}
	if tok == "" {
		return "", usagef("a bootstrap token is required (--bootstrap-token-file FILE or RIALTO_BOOTSTRAP_TOKEN)")
	}
	return tok, nil
}

// insecureDataplaneFlag registers --insecure-dataplane, the opt-out from
// TLS on the data planes for a fabric the operator trusts.
func insecureDataplaneFlag(fs *pflag.FlagSet) *bool {
	return fs.Bool("insecure-dataplane", false, "serve the data planes (NBD, memory, accelerators, NIC tunnels) without TLS, on a fabric you trust: lease credentials are still checked, but they and the data cross the network in clear (docs/operations.md)")
}

// checkDataplaneTLS refuses an agent that could serve its data planes
// only in plaintext without being told to: TLS needs the node certificate,
// which needs the cluster CA.
func checkDataplaneTLS(caCert string, insecure bool) error {
	if caCert == "" && !insecure {
		return usagef("the data planes are served over TLS with a node certificate from the cluster CA: give the CA's certificate (--cacert or RIALTO_CACERT; `rialto up` writes it to STATE/tls/ca-cert.pem), or --insecure-dataplane on a fabric you trust")
	}
	return nil
}

func runAgent(e *env, fs *pflag.FlagSet) runFunc {
	host, _ := os.Hostname()
	cp, bootS, caCert := joinFlags(fs, e)
	name := fs.String("name", host, "node name, unique in the cluster")
	stateDir := fs.String("state-dir", "rialto-agent", "identity, exports and relative backing files; keep it (an absolute path on persistent storage): a start without identity.json and exports.json, or with identity.json but without exports.json, wipes the block devices that exist and has the node's leases recorded lost")
	wipeLost := fs.Bool("wipe-lost-exports", false, "if the state dir's exports.json cannot be read, wipe every block device in full and set the file aside instead of refusing to start (the exports it listed are lost either way)")
	listen := fs.String("listen", "127.0.0.1", "host the agent API and data planes bind to (0.0.0.0 needs --advertise)")
	advertise := fs.String("advertise", "", "host put into URLs (default: --listen)")
	port := fs.Int("port", 0, "agent API port (0: as before, or free)")
	var blocks, labels, nics listFlag
	fs.Var(&blocks, "block", "lend a block device: [NAME=]PATH[:SIZE], PATH a file (created sparse, extended to SIZE) or a block device node such as /dev/sdb (SIZE: at most its size; default: all of it) (repeatable)")
	fs.Var(&nics, "nic", "lend a network interface: NAME=IFACE[:RATE], RATE what it may lend in tc's syntax (200mbit, 1gbit; default: the interface's speed, else 1gbit) (repeatable; needs root and nft)")
	mem := sizeString(fs, "memory", "", "memory budget to lend, e.g. 512MiB")
	accel := fs.Int("accel", 0, "accelerator slots to lend (an appliance; each slot gets --slot-memory)")
	slotMem := sizeString(fs, "slot-memory", "16MiB", "memory of each accelerator slot")
	movePending := sizeString(fs, "move-pending", "64MiB", "memory a block part moving from here may spend on its borrower's writes not yet written (held by the move's switch, or on their way to the file); past it the borrower's writes wait (docs/operations.md)")
	maxConns := fs.Int("max-export-conns", 64, "NBD connections one block lease may have open at once (each may hold up to 64 MiB of buffers); further ones are refused at NBD_OPT_GO (docs/operations.md)")
	maxHandshakes := fs.Int("max-handshakes", 256, "NBD connections in the option phase (no lease credential presented yet) at once; past it the one waiting longest of the source with the most is closed (docs/operations.md)")
	maxHandshakesSrc := fs.Int("max-handshakes-per-source", 64, "NBD connections in the option phase at once from one source (an IPv4 address, an IPv6 /64); past it that source's longest waiting is closed (docs/operations.md)")
	fs.Var(&labels, "label", "node label KEY=VALUE (repeatable)")
	hb := fs.Duration("heartbeat", 0, "heartbeat interval (default: the control plane's)")
	machine := fs.String("machine-id", "", "override the hardware identity")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	insecure := insecureDataplaneFlag(fs)
	pskFile := fs.String("tls-psk", "", "also serve NBD over TLS 1.3 with the pre-shared keys of `FILE` (psktool's format, identity:hexkey per line; mode 0600), for clients such as libnbd's tls-psk-file=, beside the node certificate; lease credentials are still checked (docs/nbd.md)")
	cfgFile := configFlag(fs, e)
	return func(ctx context.Context, _ []string) error {
		if err := cfgFile.apply(); err != nil {
			return err
		}
		boot, err := bootstrapToken(bootS)
		if err != nil {
			return err
		}
		if err := checkDataplaneTLS(*caCert, *insecure); err != nil {
			return err
		}
		var psk *tlspsk.Keys
		if *pskFile != "" {
			if *insecure {
				return usagef("--tls-psk needs TLS on the data planes: drop --insecure-dataplane")
			}
			if psk, err = tlspsk.LoadKeyFile(*pskFile); err != nil {
				return fmt.Errorf("--tls-psk: %w", err)
			}
		}
		log, err := newLogger(e, *level)
		if err != nil {
			return err
		}
		cfg := agent.Config{
			ControlPlane: *cp, BootstrapToken: boot, Name: *name, StateDir: *stateDir, WipeLostExports: *wipeLost,
			Listen: *listen, Advertise: *advertise, APIPort: *port, HeartbeatInterval: *hb,
			MachineID: *machine, Logger: log, Version: versionString(),
		}
		if cfg.Labels, err = parseLabels(labels); err != nil {
			return err
		}
		// With the CA the agent enrolls: a node certificate for mutual TLS
		// and the data planes' TLS.
		cfg.CAFile, cfg.InsecureDataplane, cfg.TLSPSK = *caCert, *insecure, psk
		if *insecure {
			fmt.Fprintln(e.stderr, "rialto agent: --insecure-dataplane: leases are served without TLS; their credentials and data cross the network in clear")
		}
		for i, b := range blocks {
			d, err := parseBlock(b, i)
			if err != nil {
				return err
			}
			cfg.Devices = append(cfg.Devices, d)
		}
		if cfg.MovePendingBytes, err = resource.ParseSize(*movePending); err != nil || cfg.MovePendingBytes <= 0 {
			return usagef("bad --move-pending %q: want a size such as 64MiB", *movePending)
		}
		if *maxConns <= 0 {
			return usagef("bad --max-export-conns %d: want at least 1", *maxConns)
		}
		if *maxHandshakes <= 0 {
			return usagef("bad --max-handshakes %d: want at least 1", *maxHandshakes)
		}
		if *maxHandshakesSrc <= 0 {
			return usagef("bad --max-handshakes-per-source %d: want at least 1", *maxHandshakesSrc)
		}
		cfg.MaxExportConns, cfg.MaxHandshakes, cfg.MaxHandshakesPerSource = *maxConns, *maxHandshakes, *maxHandshakesSrc
		if *mem != "" {
			n, err := resource.ParseSize(*mem)
			if err != nil {
				return usagef("bad --memory: %w", err)
			}
			cfg.Devices = append(cfg.Devices, agent.DeviceConfig{Name: "mem0", Kind: api.KindMemory, Size: n})
		}
		for _, n := range nics {
			d, err := parseNIC(n)
			if err != nil {
				return err
			}
			cfg.Devices = append(cfg.Devices, d)
		}
		if *accel > 0 {
			cfg.Devices = append(cfg.Devices, agent.DeviceConfig{Name: "accel0", Kind: api.KindAccel, Size: int64(*accel),
				Attributes: map[string]string{"slot_memory": *slotMem}})
		}
		a, err := agent.New(cfg)
		if err != nil {
			return err
		}
		defer reloadPSKOnHUP(ctx, log, *pskFile, psk)()
		return a.Run(ctx)
	}
}

// reloadPSKOnHUP reads the pre-shared key file (path, --tls-psk) again on
// every SIGHUP until ctx is done or the returned stop is called (which
// waits for it), and swaps keys' set for the file's: new handshakes use
// it, sessions already open keep theirs. A file it cannot read or that is
// refused (mode, format) is logged and changes nothing. Without a key file
// a SIGHUP only logs that there is nothing to reload (it never ends the
// agent, so `systemctl reload` is safe on every agent).
func reloadPSKOnHUP(ctx context.Context, log *slog.Logger, path string, keys *tlspsk.Keys) (stop func()) {
	return onHUP(ctx, func() {
		if keys == nil {
			log.Info("SIGHUP: nothing to reload (no --tls-psk)")
			return
		}
		fresh, err := tlspsk.LoadKeyFile(path)
		if err != nil {
			log.Error("SIGHUP: the pre-shared key file is refused; the previous keys stay", "file", path, "err", err)
			return
		}
		keys.Replace(fresh)
		log.Info("SIGHUP: pre-shared keys reloaded", "file", path, "keys", keys.Len())
	})
}
