package syncapp

import "sync"

// worker is the goroutine of a pooled object (a zone's sweeper, a
// namespace's loop, its slot holder): started when first needed, so that
// validating a config starts nothing, and stopped when the object is
// destructed.
type worker struct {
	once sync.Once
	stop chan struct{}
	done chan struct{}
}

func newWorker() worker {
	return worker{stop: make(chan struct{}), done: make(chan struct{})}
}

// start runs f in a goroutine, the first time only.
func (w *worker) start(f func()) {
	w.once.Do(func() {
		go func() {
			defer close(w.done)
			f()
		}()
	})
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
