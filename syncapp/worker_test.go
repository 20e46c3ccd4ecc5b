package syncapp

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// A worker's function that panics is logged and run again, and close
// stops it, whether it is running or waiting to run again.
func TestWorkerRecoversAndRestarts(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	w := newWorker("testing")
	var runs atomic.Int32
	again := make(chan struct{})
	w.start(zap.New(core), func() {
		if runs.Add(1) == 1 {
			panic("a bug")
		}
		close(again)
		<-w.stopping()
	})
	select {
	case <-again:
	case <-time.After(10 * restartAfter):
		t.Fatalf("the function ran %d times in %v after a panic, want it run again", runs.Load(), 10*restartAfter)
	}
	if n := logs.FilterMessage("panic testing").Len(); n != 1 {
		t.Fatalf("%d panics logged, want 1", n)
	}
	w.close()

	// A function that panics every time: close ends the wait between runs.
	w = newWorker("testing")
	w.start(zap.NewNop(), func() { panic("always") })
	w.close()
}
