// Command tls-bench is bench/tls/run.sh's helper: "cycles" runs lease
// cycles (create, then release) through a control plane's API from
// concurrent workers and prints the rate; "mem" measures a memory lease's
// 4 KiB synchronous reads (p50, p99) and bulk reads through the lease's
// URI, over TLS when the URI asks for it. Tokens come from a file, never
// the command line.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/pki"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tls-bench cycles|mem|tlsinfo [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "cycles":
		cycles(os.Args[2:])
	case "mem":
		mem(os.Args[2:])
	case "tlsinfo":
		tlsinfo(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: tls-bench cycles|mem [flags]")
		os.Exit(2)
	}
}

// apiFlags are the control plane's address, CA and token file.
type apiFlags struct{ addr, cacert, tokenFile string }

func (a *apiFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.addr, "addr", "", "control plane URL")
	fs.StringVar(&a.cacert, "cacert", "", "the cluster CA's certificate (empty: plain HTTP)")
	fs.StringVar(&a.tokenFile, "token-file", "", "file holding the API token")
}

func (a *apiFlags) client() *api.Client {
	tok, err := os.ReadFile(a.tokenFile)
	if err != nil {
		log.Fatal(err)
	}
	hc, err := api.HTTPClient(a.cacert, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	return api.NewClient(a.addr, strings.TrimSpace(string(tok)), hc)
}

func cycles(args []string) {
	fs := flag.NewFlagSet("cycles", flag.ExitOnError)
	var af apiFlags
	af.register(fs)
	workers := fs.Int("workers", 8, "concurrent borrowers")
	dur := fs.Duration("duration", 5*time.Second, "how long to run")
	size := fs.Int64("size", 1<<20, "bytes per block lease")
	_ = fs.Parse(args)
	c := af.client()
	ctx := context.Background()
	var n atomic.Int64
	var failed atomic.Int64
	stop := time.Now().Add(*dur)
	start := time.Now()
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				l, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: *size})
				if err != nil {
					failed.Add(1)
					continue
				}
				if _, err := c.ReleaseLease(ctx, l.ID); err != nil {
					failed.Add(1)
					continue
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > n.Load()/100 {
		log.Fatalf("%d of %d cycles failed", f, f+n.Load())
	}
	fmt.Printf("%.1f\n", float64(n.Load())/time.Since(start).Seconds())
}

func mem(args []string) {
	fs := flag.NewFlagSet("mem", flag.ExitOnError)
	var af apiFlags
	af.register(fs)
	lease := fs.String("lease", "", "the memory lease")
	reads := fs.Int("reads", 20000, "4 KiB synchronous reads")
	bulk := fs.Int("bulk-passes", 8, "bulk reads of the whole region")
	_ = fs.Parse(args)
	c := af.client()
	ctx := context.Background()
	l, err := c.Lease(ctx, *lease)
	if err != nil {
		log.Fatal(err)
	}
	var opts client.Options
	if af.cacert != "" {
		if opts.TLS, err = pki.LoadClientTLS(af.cacert); err != nil {
			log.Fatal(err)
		}
	}
	mc, err := borrower.DialMemory(ctx, l, 0, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer mc.Close()
	buf := make([]byte, 4096)
	// Warm up, then time each read.
	for i := range 1000 {
		if err := mc.Read(ctx, client.ChannelSync, buf, int64(i%256)*4096); err != nil {
			log.Fatal(err)
		}
	}
	lat := make([]time.Duration, *reads)
	n := mc.Size() / 4096
	for i := range lat {
		t0 := time.Now()
		if err := mc.Read(ctx, client.ChannelSync, buf, int64(i)%n*4096); err != nil {
			log.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	slices.Sort(lat)
	region := make([]byte, mc.Size())
	t0 := time.Now()
	for range *bulk {
		if err := mc.Read(ctx, client.ChannelBulk, region, 0); err != nil {
			log.Fatal(err)
		}
	}
	mibs := float64(*bulk) * float64(len(region)) / (1 << 20) / time.Since(t0).Seconds()
	fmt.Printf("%.1f %.1f %.0f\n", float64(lat[len(lat)/2].Nanoseconds())/1e3, float64(lat[len(lat)*99/100].Nanoseconds())/1e3, mibs)
}

// tlsinfo dials an nbds:// URI with Go's client trusting cacert and prints
// the TLS version and cipher suite the server chose (for the report).
func tlsinfo(args []string) {
	fs := flag.NewFlagSet("tlsinfo", flag.ExitOnError)
	uri := fs.String("uri", "", "the nbds:// URI")
	cacert := fs.String("cacert", "", "the cluster CA's certificate")
	_ = fs.Parse(args)
	cfg, err := pki.LoadClientTLS(*cacert)
	if err != nil {
		log.Fatal(err)
	}
	verify := cfg.VerifyConnection
	var st tls.ConnectionState
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		st = cs
		return verify(cs)
	}
	u, err := nbd.ParseURI(*uri)
	if err != nil {
		log.Fatal(err)
	}
	c, err := u.Dial(context.Background(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	c.Close()
	fmt.Printf("%s %s, certificate %s\n", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite), st.PeerCertificates[0].PublicKeyAlgorithm)
}
