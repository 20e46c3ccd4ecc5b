// Package pgtest starts real PostgreSQL servers for tests, each in a
// temporary directory of its own and on a free loopback port, and removes
// them when the test ends. Tests own their servers, so they can stop, kill
// and restart them to test faults. A server never uses the machine's own
// PostgreSQL, its port (5432) or its data.
//
// The server binaries (initdb and postgres) are looked up on PATH, then in
// Debian's /usr/lib/postgresql/<version>/bin, highest version first. When
// they are missing, tests fail under CI (the CI environment variable is
// set) and are skipped elsewhere, so a developer without PostgreSQL can
// still run the rest. PostgreSQL refuses to run as root: a test running as
// root runs the server as the postgres OS user, which owns the directory.
package pgtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// debianDirs is where Debian's postgresql packages put the server
// binaries, one directory per major version.
const debianDirs = "/usr/lib/postgresql/*/bin"

// Binaries are the paths of the server programs a test needs.
type Binaries struct {
	InitDB   string
	Postgres string
}

// Find returns the server binaries: initdb and postgres from PATH, or
// else from the highest version under /usr/lib/postgresql.
func Find() (Binaries, error) {
	initdb, err1 := exec.LookPath("initdb")
	postgres, err2 := exec.LookPath("postgres")
	if err1 == nil && err2 == nil {
		return Binaries{initdb, postgres}, nil
	}
	dirs, _ := filepath.Glob(debianDirs)
	// Highest version first: 15 after 9.6, 16 after 15.
	version := func(dir string) []int {
		var v []int
		for _, p := range strings.Split(filepath.Base(filepath.Dir(dir)), ".") {
			n, _ := strconv.Atoi(p)
			v = append(v, n)
		}
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int { return -slices.Compare(version(a), version(b)) })
	for _, dir := range dirs {
		b := Binaries{filepath.Join(dir, "initdb"), filepath.Join(dir, "postgres")}
		if isExecutable(b.InitDB) && isExecutable(b.Postgres) {
			return b, nil
		}
	}
	return Binaries{}, fmt.Errorf("initdb and postgres are neither on PATH nor in %s", debianDirs)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Require returns the server binaries, or ends the test: it fails under CI
// and is skipped elsewhere when they are missing, and is skipped in -short
// mode, the quick run of scripts/test.sh -short.
func Require(t testing.TB) Binaries {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: a quick run starts no PostgreSQL server")
	}
	b, err := Find()
	if err == nil {
		return b
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("PostgreSQL is required in CI and was not found: %v (scripts/test.sh installs it)", err)
	}
	t.Skipf("PostgreSQL not found (%v); scripts/test.sh installs it", err)
	return Binaries{}
}

// Server is one PostgreSQL server that a test owns. It trusts every local
// connection: the superuser is postgres, with no password. Its methods are
// meant for the test's goroutine.
type Server struct {
	// Addr is host:port on the loopback interface.
	Addr string
	// Port is the server's TCP port.
	Port int
	// Dir holds the data directory, the log (postgres.log) and the server's
	// Unix socket.
	Dir string

	t    testing.TB
	bin  Binaries
	data string
	log  string
	cred *syscall.Credential // whom the server runs as; nil: ourselves

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
}

// Start creates a database cluster in a new temporary directory, starts a
// server on a free loopback port and waits until it accepts connections.
// When the test ends, the server is killed and the directory removed.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: Require(t)}
	cred, uid, gid, err := serverUser()
	if err != nil {
		t.Fatal(err)
	}
	s.cred = cred
	// Not t.TempDir: its parent is private to us, and the server may run
	// as another user. A short path keeps the socket's under the limit.
	if s.Dir, err = os.MkdirTemp("", "pgtest-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Kill()
		if err := os.RemoveAll(s.Dir); err != nil {
			t.Errorf("pgtest: removing %s: %v", s.Dir, err)
		}
	})
	if cred != nil {
		if err := os.Chown(s.Dir, uid, gid); err != nil {
			t.Fatalf("pgtest: giving %s to the postgres user: %v", s.Dir, err)
		}
	}
	s.data = filepath.Join(s.Dir, "data")
	s.log = filepath.Join(s.Dir, "postgres.log")

	cmd := exec.Command(s.bin.InitDB, "-D", s.data, "-A", "trust", "-U", "postgres",
		"--no-sync", "-E", "UTF8", "--locale=C")
	s.prepare(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}

	for attempt := 1; ; attempt++ {
		s.Port = redistest.FreePort(t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		err := s.launch()
		if err == nil {
			return s
		}
		if !errors.Is(err, errBusy) || attempt == 5 {
			t.Fatal(err)
		}
	}
}

// serverUser returns whom the server must run as: nil (ourselves), unless
// we are root, which PostgreSQL refuses; then the postgres OS user.
func serverUser() (cred *syscall.Credential, uid, gid int, err error) {
	if os.Geteuid() != 0 {
		return nil, 0, 0, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("pgtest: PostgreSQL will not run as root, and there is no postgres user to run it as: %v", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := cmp.Or(err1, err2); err != nil {
		return nil, 0, 0, fmt.Errorf("pgtest: the postgres user's ids %s:%s: %v", u.Uid, u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, nil
}

// prepare makes cmd run as the server's user, in the server's directory,
// without the PG* variables of the environment.
func (s *Server) prepare(cmd *exec.Cmd) {
	cmd.Dir = s.Dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	setProcAttr(cmd, s.cred)
}

// errBusy reports that the server could not start for now: another
// process holds its port, or the processes of a killed server still hold
// its shared memory.
var errBusy = errors.New("busy")

// launch starts postgres on s.Port and waits until it accepts connections.
func (s *Server) launch() error {
	logf, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %v", err)
	}
	defer logf.Close()
	// The log tells why this launch failed: read from its end at exit.
	from, _ := logf.Seek(0, 2)
	// Without fsync a commit reaches the kernel, not the disk: it survives
	// a killed server, though not a crashed machine, which tests do not
	// need. Commits stay synchronous, so Kill loses none. Tests run fleets
	// of up to 64 nodes on one server, each with a pool of its own.
	cmd := exec.Command(s.bin.Postgres,
		"-D", s.data,
		"-p", strconv.Itoa(s.Port),
		"-k", s.Dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=300",
		"-c", "shared_buffers=32MB",
		"-c", "fsync=off",
		"-c", "full_page_writes=off")
	s.prepare(cmd)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: starting postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	logTail := func() string {
		b, _ := os.ReadFile(s.log)
		if int(from) <= len(b) {
			b = b[from:]
		}
		return string(b)
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			s.cmd = nil
			log := logTail()
			if strings.Contains(log, "already in use") || strings.Contains(log, "still in use") {
				return fmt.Errorf("postgres on %s: %w:\n%s", s.Addr, errBusy, log)
			}
			return fmt.Errorf("pgtest: postgres on %s exited at start:\n%s", s.Addr, log)
		default:
		}
		err := s.ours()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("pgtest: postgres on %s did not start: %v\n%s", s.Addr, err, logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ours connects to the server and checks that it is this one (its data
// directory), not another process that listens on the port.
func (s *Server) ours() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres")+"&application_name="+helperApp)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir); err != nil {
		return err
	}
	if dir != s.data {
		return fmt.Errorf("another server, of %s, listens on %s", dir, s.Addr)
	}
	return nil
}

// DSN returns a connection string for database db on this server, as the
// postgres superuser, over TCP without TLS.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.Addr, url.PathEscape(db))
}

// helperApp is the application_name of the connections that the helper
// makes for itself, which Connections does not count: the server ends a
// closed connection's backend a moment after the client leaves.
const helperApp = "pgtest"

// helperConn connects to the postgres database for the helper's own use.
func (s *Server) helperConn(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres")+"&application_name="+helperApp)
	if err != nil {
		t.Fatalf("pgtest: connecting: %v", err)
	}
	return conn
}

// CreateDB creates a database and returns its DSN.
func (s *Server) CreateDB(t testing.TB, name string) string {
	t.Helper()
	ctx := context.Background()
	conn := s.helperConn(t)
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	return s.DSN(name)
}

// Conn connects to database db as the superuser, for a test's own
// queries and assertions. The connection is closed when the test ends.
func (s *Server) Conn(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN(db))
	if err != nil {
		t.Fatalf("pgtest: connecting to %s: %v", db, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Connections returns how many client connections database db has, not
// counting the helper's own (such as the one that asks).
func (s *Server) Connections(t testing.TB, db string) int {
	t.Helper()
	ctx := context.Background()
	conn := s.helperConn(t)
	defer conn.Close(ctx)
	var n int
	err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = $1 AND backend_type = 'client backend'
		AND pid <> pg_backend_pid() AND application_name IS DISTINCT FROM $2`, db, helperApp).Scan(&n)
	if err != nil {
		t.Fatalf("pgtest: counting connections: %v", err)
	}
	return n
}

// Stop shuts the server down the fast way (SIGINT: it disconnects every
// client and writes a checkpoint) and waits until it has exited. The data
// stays: Start brings it back.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
		s.cmd = nil
	case <-time.After(30 * time.Second):
		s.t.Errorf("pgtest: postgres on %s did not stop within 30s: killing it", s.Addr)
		s.Kill()
	}
}

// Kill stops the server and its children at once with SIGKILL, as a crash
// would, and waits until they are gone. The data stays: Start brings it
// back, with crash recovery.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	pid := s.cmd.Process.Pid
	// Freeze the server so that it starts no child meanwhile, then kill
	// its children (each in a session of its own) and the server.
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	kids := children(pid)
	for _, kid := range kids {
		_ = syscall.Kill(kid, syscall.SIGKILL)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
	deadline := time.Now().Add(10 * time.Second)
	for _, kid := range kids {
		for alive(kid) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Start starts a stopped or killed server again, on the same port and with
// the same data, and waits until it accepts connections. While its port or
// the shared memory of a killed server's last processes is still held, it
// tries again.
func (s *Server) Start() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("pgtest: Start of a running server")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.launch()
		if err == nil {
			return
		}
		if !errors.Is(err, errBusy) || time.Now().After(deadline) {
			s.t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Running reports whether the server process is running.
func (s *Server) Running() bool { return s.cmd != nil }

// StopImmediate stops the server as `pg_ctl stop -m immediate` does
// (SIGQUIT: every process exits at once, without a checkpoint, and the
// next start runs crash recovery), and waits until it has exited. The data
// stays: Start brings it back.
func (s *Server) StopImmediate() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
		s.cmd = nil
	case <-time.After(30 * time.Second):
		s.t.Errorf("pgtest: postgres on %s did not stop within 30s of SIGQUIT: killing it", s.Addr)
		s.Kill()
	}
}
