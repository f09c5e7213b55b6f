// Command nbdserve serves one file over NBD with Rialto's nbd package, for
// benchmarks and manual interop checks (the rialto binary does this for real
// leases). It binds to 127.0.0.1 unless told otherwise.
//
//	nbdserve -addr 127.0.0.1:10809 -name EXPORT -file IMG [-offset N -length N] [-readonly]
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:10809", "listen address (host:port, or unix:PATH)")
	name := flag.String("name", "", "export name (a credential; never logged)")
	file := flag.String("file", "", "file or block device to serve")
	offset := flag.Int64("offset", 0, "partition offset")
	length := flag.Int64("length", 0, "partition length (0 = to the end)")
	ro := flag.Bool("readonly", false, "serve read-only")
	workers := flag.Int("workers", 0, "workers per connection (0 = default)")
	verbose := flag.Bool("v", false, "debug logging")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile here until exit")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *file == "" {
		fmt.Fprintln(os.Stderr, "nbdserve: -file is required")
		os.Exit(2)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	be, err := nbd.OpenFile(*file, nbd.FileOptions{Offset: *offset, Length: *length, ReadOnly: *ro})
	if err != nil {
		log.Error("open", "err", err)
		os.Exit(1)
	}
	defer be.Close()
	s := &nbd.Server{Logger: log, Workers: *workers}
	if err := s.AddExport(nbd.Export{Name: *name, Backend: be, ReadOnly: *ro}); err != nil {
		log.Error("export", "err", err)
		os.Exit(1)
	}
	network, laddr := "tcp", *addr
	if p, ok := strings.CutPrefix(laddr, "unix:"); ok {
		network, laddr = "unix", p
		os.Remove(p)
	}
	ln, err := net.Listen(network, laddr)
	if err != nil {
		log.Error("listen", "err", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := s.Serve(ctx, ln); err != nil {
		log.Error("serve", "err", err)
	}
}
