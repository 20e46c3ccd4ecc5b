package proc

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestStopAndLog(t *testing.T) {
	dir := t.TempDir()
	p, err := Start(filepath.Join(dir, "sh.log"), []string{"GREETING=hello"}, "sh", "-c", `echo one; echo "$GREETING"; exec sleep 30`)
	if err != nil {
		t.Fatal(err)
	}
	err = p.WaitUntil(context.Background(), 10*time.Second, 10*time.Millisecond, func() bool { return p.Log(1) == "hello" })
	if err != nil {
		t.Fatalf("waiting for the output: %v (log %q)", err, p.Log(5))
	}
	if got := p.Log(5); got != "one\nhello" {
		t.Fatalf("log %q", got)
	}
	if !p.Running() {
		t.Fatal("not running before Stop")
	}
	p.Stop(syscall.SIGTERM, 5*time.Second)
	if p.Running() {
		t.Fatal("running after Stop")
	}
}

func TestWaitUntilAProcessThatExits(t *testing.T) {
	p, err := Start(filepath.Join(t.TempDir(), "true.log"), nil, "true")
	if err != nil {
		t.Fatal(err)
	}
	err = p.WaitUntil(context.Background(), 10*time.Second, 10*time.Millisecond, func() bool { return false })
	if err == nil || p.Running() {
		t.Fatalf("WaitUntil = %v, running %v; want an error once it exited", err, p.Running())
	}
}
