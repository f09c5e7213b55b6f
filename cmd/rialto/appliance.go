package main

import (
	"context"
	"fmt"
	"os"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "appliance", Summary: "Run a standalone accelerator appliance: join a control plane and lend its slots.", Run: runAppliance})
}

// runAppliance is an agent that lends only accelerator slots: it joins
// like an agent (boot, register, heartbeat with health), and its slots each
// listen on a port of their own and load the role a lease asks for.
func runAppliance(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "appliance", "")
	host, _ := os.Hostname()
	addr := e.getenv("RIALTO_ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	cp := fs.String("control-plane", addr, "control plane URL (env RIALTO_ADDR)")
	boot := fs.String("bootstrap-token", e.getenv("RIALTO_BOOTSTRAP_TOKEN"), "bootstrap token (env RIALTO_BOOTSTRAP_TOKEN)")
	name := fs.String("name", host+"-appliance", "node name, unique in the cluster")
	stateDir := fs.String("state-dir", "rialto-appliance", "identity and export state")
	slots := fs.Int("slots", 4, "accelerator slots (each listens on its own port)")
	slotMem := fs.String("slot-memory", "16MiB", "memory of each slot (an offset table keeps slots apart)")
	listen := fs.String("listen", "127.0.0.1", "host the management API and slots bind to (0.0.0.0 needs --advertise)")
	advertise := fs.String("advertise", "", "host put into URLs (default: --listen)")
	port := fs.Int("port", 0, "management API port (0: as before, or free)")
	var labels listFlag
	fs.Var(&labels, "label", "node label KEY=VALUE (repeatable)")
	hb := fs.Duration("heartbeat", 0, "heartbeat interval (default: the control plane's)")
	machine := fs.String("machine-id", "", "override the hardware identity")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *boot == "" {
		return fmt.Errorf("a bootstrap token is required (--bootstrap-token or RIALTO_BOOTSTRAP_TOKEN)")
	}
	if *slots < 1 {
		return fmt.Errorf("--slots must be at least 1")
	}
	if n, err := resource.ParseSize(*slotMem); err != nil || n <= 0 {
		return fmt.Errorf("bad --slot-memory %q", *slotMem)
	}
	log, err := newLogger(e, *level)
	if err != nil {
		return err
	}
	cfg := agent.Config{
		ControlPlane: *cp, BootstrapToken: *boot, Name: *name, StateDir: *stateDir,
		Listen: *listen, Advertise: *advertise, APIPort: *port, HeartbeatInterval: *hb,
		MachineID: *machine, Logger: log.With("appliance", *name),
		Devices: []agent.DeviceConfig{{Name: "accel0", Kind: api.KindAccel, Size: int64(*slots), Model: "rialto-appliance", Sharing: "partitionable",
			Attributes: map[string]string{"slot_memory": *slotMem}}},
	}
	if cfg.Labels, err = parseLabels(labels); err != nil {
		return err
	}
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	if _, ok := cfg.Labels["role"]; !ok {
		cfg.Labels["role"] = "appliance"
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
