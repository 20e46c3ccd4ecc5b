//go:build lockorder

package lockorder

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
)

// Mutex is a sync.Mutex of class C, whose order is checked.
type Mutex[C any] struct{ m sync.Mutex }

// Lock checks the order, then locks m.
func (m *Mutex[C]) Lock() { lock[C](m.m.Lock) }

// TryLock checks the order, then tries to lock m.
func (m *Mutex[C]) TryLock() bool {
	class := className[C]()
	check(class)
	if !m.m.TryLock() {
		return false
	}
	hold(class)
	return true
}

// Unlock unlocks m.
func (m *Mutex[C]) Unlock() { unlock[C](m.m.Unlock) }

// RWMutex is a sync.RWMutex of class C, whose order is checked.
type RWMutex[C any] struct{ m sync.RWMutex }

// Lock checks the order, then locks m.
func (m *RWMutex[C]) Lock() { lock[C](m.m.Lock) }

// Unlock unlocks m.
func (m *RWMutex[C]) Unlock() { unlock[C](m.m.Unlock) }

// RLock checks the order, then read-locks m.
func (m *RWMutex[C]) RLock() { lock[C](m.m.RLock) }

// RUnlock read-unlocks m.
func (m *RWMutex[C]) RUnlock() { unlock[C](m.m.RUnlock) }

// Held records that a lock of class C, which is not a Mutex or RWMutex
// (a channel, say), is taken, once the order is checked.
func Held[C any]() { lock[C](func() {}) }

// Released records that a lock of class C that Held recorded is given
// back.
func Released[C any]() { unlock[C](func() {}) }

// lock checks that a lock of class C may be taken, takes it with take,
// and records it as held by the goroutine.
func lock[C any](take func()) {
	class := className[C]()
	check(class)
	take()
	hold(class)
}

// unlock forgets a lock of class C, and gives it back with give.
func unlock[C any](giveBack func()) {
	give(className[C]())
	giveBack()
}

// fail reports a lock taken out of order: it prints msg and the stack, and
// ends the program, so that no recover (a worker's, say) hides it and no
// lock it left held makes the program hang instead. Tests of the package
// replace it.
var fail = func(msg string) {
	fmt.Fprintf(os.Stderr, "%s\n\n%s\n", msg, debug.Stack())
	os.Exit(2)
}

// held is, per goroutine, the classes of the locks it holds, in the order
// taken, in shards by goroutine ID, so that goroutines seldom wait for one
// another's bookkeeping.
var held [64]struct {
	sync.Mutex
	by map[uint64][]string
}

func shardOf(g uint64) *struct {
	sync.Mutex
	by map[uint64][]string
} {
	return &held[g%uint64(len(held))]
}

// check panics if the goroutine holds a lock that class may not be taken
// under.
func check(class string) {
	g := goid()
	s := shardOf(g)
	s.Lock()
	for _, h := range s.by[g] {
		if !allowed(h, class) {
			msg := fmt.Sprintf("lock order: %s taken while holding %s (held: %v); declare the order, or take it first", class, h, s.by[g])
			s.Unlock()
			fail(msg)
			return
		}
	}
	s.Unlock()
}

// hold records that the goroutine holds a lock of class.
func hold(class string) {
	g := goid()
	s := shardOf(g)
	s.Lock()
	if s.by == nil {
		s.by = make(map[uint64][]string)
	}
	s.by[g] = append(s.by[g], class)
	s.Unlock()
}

// give records that a lock of class is given back: by the goroutine that
// holds it, or else by another (a lock may be unlocked by any goroutine).
func give(class string) {
	g := goid()
	if drop(g, class) {
		return
	}
	for i := range held {
		s := &held[i]
		s.Lock()
		var owner uint64
		found := false
		for o, locks := range s.by {
			if slices.Contains(locks, class) {
				owner, found = o, true
				break
			}
		}
		s.Unlock()
		if found && drop(owner, class) {
			return
		}
	}
}

// drop forgets the last lock of class that goroutine g holds, and reports
// whether it held one.
func drop(g uint64, class string) bool {
	s := shardOf(g)
	s.Lock()
	defer s.Unlock()
	locks := s.by[g]
	for i := len(locks) - 1; i >= 0; i-- {
		if locks[i] == class {
			if locks = slices.Delete(locks, i, i+1); len(locks) == 0 {
				delete(s.by, g)
			} else {
				s.by[g] = locks
			}
			return true
		}
	}
	return false
}

// goid returns the current goroutine's ID, from its stack's header.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	b = b[:bytes.IndexByte(b, ' ')]
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}
