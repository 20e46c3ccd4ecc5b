package syncapp

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// restartAfter is how long a worker waits before it runs its function
// again after a panic, so that a panic on every run does not spin.
const restartAfter = time.Second

// worker is the goroutine of a pooled object (a zone's sweeper, a
// namespace's loop, its slot holder): started when first needed, so that
// validating a config starts nothing, and stopped when the object is
// destructed. It is the one owner of its goroutine: a panic is recovered
// and logged, and the function runs again until the worker is stopped, so
// that a bug neither takes the server down nor leaves an object without
// its goroutine.
type worker struct {
	logger *zap.Logger
	what   string // what the goroutine does, for the log of a panic
	once   sync.Once
	stop   chan struct{}
	done   chan struct{}
}

func newWorker(what string) worker {
	return worker{what: what, stop: make(chan struct{}), done: make(chan struct{})}
}

// start runs f in a goroutine, the first time only; logger logs its
// panics.
func (w *worker) start(logger *zap.Logger, f func()) {
	w.once.Do(func() {
		w.logger = logger
		go func() {
			defer close(w.done)
			for !w.run(f) {
				select {
				case <-w.stop:
					return
				case <-time.After(restartAfter):
				}
			}
		}()
	})
}

// run runs f, and reports false if it panicked.
func (w *worker) run(f func()) (returned bool) {
	defer recoverAndLog(w.logger, w.what)
	f()
	return true
}

// stopping is closed when the worker is told to stop.
func (w *worker) stopping() <-chan struct{} { return w.stop }

// close tells the goroutine to stop and waits for it, if it started.
func (w *worker) close() {
	close(w.stop)
	started := true
	w.once.Do(func() { started = false })
	if started {
		<-w.done
	}
}
