package pgserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotInstalled says that no PostgreSQL server binaries were found.
var ErrNotInstalled = errors.New("pgserver: PostgreSQL is not installed (initdb and pg_ctl not found on PATH or in /usr/lib/postgresql/*/bin); install it, e.g. `apt-get install postgresql` on Debian")

// Options tune a server. The zero value is a durable server (fsync and
// synchronous commit on, PostgreSQL's defaults).
type Options struct {
	// Settings are extra postgresql.conf settings (name → value).
	Settings map[string]string
	// Port to listen on; 0 picks a free one (kept across restarts).
	Port int
}

// Server is a PostgreSQL server running in Dir.
type Server struct {
	Dir      string // the server's directory: the password file, the port, the data directory's location
	data     string // the data directory
	Port     int
	User     string // the database superuser's name
	bin      string // directory of initdb, pg_ctl and postgres
	runAs    *user.User
	password string
}

// FindBin returns the directory holding initdb and pg_ctl.
func FindBin() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if _, err := exec.LookPath("initdb"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNotInstalled
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Start initializes dir (if it holds no cluster yet) and starts the
// server. A directory that already holds a cluster is started as it is,
// with the password kept in it.
func Start(ctx context.Context, dir string, o Options) (*Server, error) {
	bin, err := FindBin()
	if err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, User: "rialto", bin: bin, Port: o.Port}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgserver: running as root, PostgreSQL must run as an unprivileged user, and there is no user \"postgres\": %w", err)
		}
		s.runAs = u
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	pwFile := filepath.Join(dir, "password")
	if b, err := os.ReadFile(pwFile); err == nil {
		s.password = strings.TrimSpace(string(b))
	} else {
		var r [16]byte
		if _, err := rand.Read(r[:]); err != nil {
			return nil, err
		}
		s.password = hex.EncodeToString(r[:])
		if err := os.WriteFile(pwFile, []byte(s.password+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("pgserver: %w", err)
		}
	}
	if err := s.chown(dir); err != nil {
		return nil, err
	}
	if err := s.placeData(ctx); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(s.dataDir(), "PG_VERSION")); err != nil {
		if err := s.initdb(ctx, pwFile); err != nil {
			return nil, err
		}
	}
	if s.Port == 0 {
		if b, err := os.ReadFile(filepath.Join(dir, "port")); err == nil {
			s.Port, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	}
	if s.Port == 0 {
		if s.Port, err = freePort(); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "port"), []byte(strconv.Itoa(s.Port)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(s.Port),
		"unix_socket_directories = ''", // TCP on loopback only (a long state-dir path would not fit a socket's)
		"max_connections = 200",
		"shared_buffers = '128MB'",
		"deadlock_timeout = '100ms'",
		"log_min_messages = 'warning'",
		"logging_collector = off",
	}
	keys := make([]string, 0, len(o.Settings))
	for k := range o.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		conf = append(conf, k+" = '"+strings.ReplaceAll(o.Settings[k], "'", "''")+"'")
	}
	if err := os.WriteFile(filepath.Join(s.dataDir(), "postgresql.auto.conf"), []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	if err := s.chown(filepath.Join(s.dataDir(), "postgresql.auto.conf")); err != nil {
		return nil, err
	}
	if err := s.Restart(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) dataDir() string { return s.data }

// DataDir is the server's data directory.
func (s *Server) DataDir() string { return s.data }

// Attach returns the server a Start made in dir, without starting it: to
// stop it (Stop) and remove it (Remove) after its owner went away.
func Attach(dir string) (*Server, error) {
	bin, err := FindBin()
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, User: "rialto", bin: bin}
	if os.Geteuid() == 0 {
		if s.runAs, err = user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("pgserver: %w", err)
		}
	}
	s.data = filepath.Join(dir, "data")
	if b, err := os.ReadFile(filepath.Join(dir, "datadir")); err == nil {
		s.data = strings.TrimSpace(string(b))
	}
	b, err := os.ReadFile(filepath.Join(dir, "port"))
	if err != nil {
		return nil, fmt.Errorf("pgserver: no server in %s: %w", dir, err)
	}
	s.Port, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	if b, err := os.ReadFile(filepath.Join(dir, "password")); err == nil {
		s.password = strings.TrimSpace(string(b))
	}
	return s, nil
}

// placeData chooses the data directory: Dir/data, or, when the server's
// user cannot reach Dir (a root-only state directory), a directory of its
// own under the system's temporary directory, whose path is kept in
// Dir/datadir so that a restart finds it again. Remove deletes it.
func (s *Server) placeData(ctx context.Context) error {
	if b, err := os.ReadFile(filepath.Join(s.Dir, "datadir")); err == nil {
		s.data = strings.TrimSpace(string(b))
		return nil
	}
	s.data = filepath.Join(s.Dir, "data")
	if s.runAs == nil || s.command(ctx, "test", "-w", s.Dir).Run() == nil {
		return nil
	}
	d, err := os.MkdirTemp("", "rialto-pg-")
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	s.data = filepath.Join(d, "data")
	if err := os.WriteFile(filepath.Join(s.Dir, "datadir"), []byte(s.data+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return s.chown(d)
}

// Remove deletes the server's data (stop it first) and Dir.
func (s *Server) Remove() error {
	var err error
	if s.data != filepath.Join(s.Dir, "data") {
		err = os.RemoveAll(filepath.Dir(s.data))
	}
	return errors.Join(err, os.RemoveAll(s.Dir))
}

// chown gives path to the user the server runs as.
func (s *Server) chown(path string) error {
	if s.runAs == nil {
		return nil
	}
	uid, _ := strconv.Atoi(s.runAs.Uid)
	gid, _ := strconv.Atoi(s.runAs.Gid)
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// command runs a PostgreSQL program as the server's user.
func (s *Server) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	path := progPath(s.bin, prog)
	if !filepath.IsAbs(prog) && prog == "test" {
		path = prog
	}
	var cmd *exec.Cmd
	if s.runAs != nil {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", s.runAs.Username, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	return cmd
}

// progPath is the path of PostgreSQL's program prog: in bin, else
// beside the program pg_ctl in bin links to (a bin on PATH that holds
// links to a few of them only, e.g. /usr/local/bin).
func progPath(bin, prog string) string {
	path := filepath.Join(bin, prog)
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if real, err := filepath.EvalSymlinks(filepath.Join(bin, "pg_ctl")); err == nil {
		if p := filepath.Join(filepath.Dir(real), prog); p != path {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return path
}

func (s *Server) run(ctx context.Context, prog string, args ...string) error {
	cmd := s.command(ctx, prog, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgserver: %s: %w: %s", prog, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (s *Server) initdb(ctx context.Context, pwFile string) error {
	// initdb reads the password from a file it can read: a copy owned by
	// the server's user, removed afterwards.
	tmp := filepath.Join(filepath.Dir(s.data), "initpw")
	if err := os.WriteFile(tmp, []byte(s.password+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	defer os.Remove(tmp)
	if err := s.chown(tmp); err != nil {
		return err
	}
	return s.run(ctx, "initdb", "-D", s.dataDir(), "-U", s.User, "--pwfile="+tmp, "--auth=scram-sha-256",
		"-E", "UTF8", "--locale=C", "--no-sync")
}

// Restart starts the server (after Stop or Kill) and waits until it
// accepts connections. A server already running in the directory (one
// whose owner was killed) is used as it is.
func (s *Server) Restart(ctx context.Context) error {
	if s.Port != 0 && s.run(ctx, "pg_ctl", "-D", s.dataDir(), "status") == nil {
		// Running, or the process of a killed one not reaped yet: only
		// a server that answers counts.
		if answers(net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))) {
			return nil
		}
	}
	logFile := filepath.Join(filepath.Dir(s.data), "server.log")
	if f, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
		f.Close()
		if err := s.chown(logFile); err != nil {
			return err
		}
	}
	if err := s.run(ctx, "pg_ctl", "-D", s.dataDir(), "-l", logFile, "-w", "-t", "60", "start"); err != nil {
		return err
	}
	return nil
}

// Stop stops the server: mode is "fast" (disconnect clients, clean
// shutdown) or "immediate" (as if it crashed: recovery runs at the next
// start).
func (s *Server) Stop(ctx context.Context, mode string) error {
	return s.run(ctx, "pg_ctl", "-D", s.dataDir(), "-m", mode, "-w", "-t", "60", "stop")
}

// Checksums reports whether the cluster has data checksums on: initdb's
// default from PostgreSQL 18 on, off before (pg_controldata's "Data page
// checksum version", 0 for off).
func (s *Server) Checksums(ctx context.Context) (bool, error) {
	cmd := s.command(ctx, "pg_controldata", "-D", s.dataDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return false, fmt.Errorf("pgserver: pg_controldata: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(line, "Data page checksum version:"); ok {
			return strings.TrimSpace(v) != "0", nil
		}
	}
	return false, errors.New("pgserver: pg_controldata: no data page checksum version")
}

// SetChecksums turns the cluster's data checksums on or off
// (pg_checksums) while the server is stopped; a cluster already so is
// left as it is. Like initdb here, it does not wait for the files to
// reach the disk.
func (s *Server) SetChecksums(ctx context.Context, on bool) error {
	now, err := s.Checksums(ctx)
	if err != nil || now == on {
		return err
	}
	mode := "--disable"
	if on {
		mode = "--enable"
	}
	return s.run(ctx, "pg_checksums", "-D", s.dataDir(), mode, "--no-sync")
}

// Kill sends SIGKILL to the postmaster (its children exit when they see
// it gone), as a crash would. Start it again with Restart.
func (s *Server) Kill() error {
	b, err := os.ReadFile(filepath.Join(s.dataDir(), "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return fmt.Errorf("pgserver: postmaster.pid: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	// Gone once it cannot be signalled (its parent, init, reaps it): a
	// Restart must not find the dying server's socket.
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; {
		if time.Now().After(deadline) {
			return fmt.Errorf("pgserver: postmaster %d still there 10 s after SIGKILL", pid)
		}
		time.Sleep(5 * time.Millisecond) // polling a process we cannot wait on
	}
	return nil
}

// answers reports whether a PostgreSQL server answers at addr: it answers
// an SSLRequest with one byte ('S' or 'N'), which a socket still open in a
// dying server's process does not.
func answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	// Length 8, the SSLRequest code 80877103.
	if _, err := c.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		return false
	}
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		return false
	}
	return b[0] == 'S' || b[0] == 'N'
}

// Close stops the server (fast) and removes nothing.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return s.Stop(ctx, "fast")
}

// URL is the connection URL of database db (with the password: keep it
// out of logs and command lines).
func (s *Server) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(s.User, s.password), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// CreateDatabase creates database name (no error if it exists).
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: connect: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if n > 0 {
		return nil
	}
	if _, err := c.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgserver: create database %s: %w", name, err)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
