package vm

import (
	"context"
	"crypto/tls"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd/nbdtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestTLSDiskWithQEMU: a disk that requires TLS (an nbds:// lease) is
// attached by qemu's own NBD client with tls-creds-x509 credentials that
// trust the cluster CA; credentials of another CA are refused at
// blockdev-add, and the export name never shows in qemu's answer.
func TestTLSDiskWithQEMU(t *testing.T) {
	qemu := needQEMU(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ca, err := pki.Open(filepath.Join(t.TempDir(), "ca"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Open(filepath.Join(t.TempDir(), "other"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "rlc_vm_tls_secret_export"
	srv := &nbd.Server{}
	if srv.TLSConfig, err = ca.ServerConfig("node-1", []string{"127.0.0.1"}, tls.NoClientCert, 0); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddExport(nbd.Export{Name: secret, Backend: nbd.NewMemBackend(4 << 20)}); err != nil {
		t.Fatal(err)
	}
	ln := nbdtest.Listen(t)
	nbdtest.Serve(t, srv, ln)

	for _, tc := range []struct {
		name, dir string
		ok        bool
	}{
		{"cluster CA", ca.Dir(), true},
		{"another CA", other.Dir(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "qmp.sock")
			cmd := exec.Command(qemu, "-machine", "none", "-nodefaults", "-no-user-config", "-display", "none", "-S",
				"-qmp", "unix:"+sock+",server=on,wait=off")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			go func() { waited <- cmd.Wait() }()
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-waited })
			var q *QMP
			deadline := time.Now().Add(30 * time.Second)
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				if q, err = DialQMP(ctx, sock, redactor(secret)); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("QMP: %v", err)
				}
				<-tick.C
			}
			defer q.Close()
			c := Config{Disk: nbd.URI{Network: "tcp", Address: ln.Addr().String(), Export: secret, TLS: true}, TLSDir: tc.dir}
			if _, err := q.Execute(ctx, "object-add", c.tlsCreds()); err != nil {
				t.Fatalf("object-add: %v", err)
			}
			_, err := q.Execute(ctx, "blockdev-add", c.blockdev())
			if tc.ok && err != nil {
				t.Fatalf("blockdev-add over TLS: %v", err)
			}
			if !tc.ok && (!errors.Is(err, ErrQMP) || strings.Contains(err.Error(), secret)) {
				t.Fatalf("blockdev-add trusting another CA: %v", err)
			}
		})
	}
}
