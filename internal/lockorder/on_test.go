//go:build lockorder

package lockorder

import (
	"strings"
	"testing"
)

type (
	outerClass struct{}
	firstClass struct{}
	laterClass struct{}
	leafClass  struct{}
)

var _ = Order("lockorder.firstClass < lockorder.laterClass") && Outer("lockorder.outerClass")

func init() { fail = func(msg string) { panic(msg) } }

// panics returns what f panicked with, or "".
func panics(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = r.(string)
		}
	}()
	f()
	return ""
}

func TestOrder(t *testing.T) {
	var (
		outer Mutex[outerClass]
		first RWMutex[firstClass]
		later Mutex[laterClass]
		leaf  Mutex[leafClass]
	)
	// In order: fine.
	outer.Lock()
	first.RLock()
	later.Lock()
	later.Unlock()
	first.RUnlock()
	leaf.Lock() // under an outer lock
	leaf.Unlock()
	outer.Unlock()

	// Out of order: the second lock fails (here, panics) before it blocks.
	later.Lock()
	msg := panics(first.Lock)
	later.Unlock()
	if !strings.Contains(msg, "lockorder.firstClass taken while holding lockorder.laterClass") {
		t.Errorf("an inversion panicked with %q", msg)
	}
	// Nothing under a leaf.
	leaf.Lock()
	msg = panics(later.Lock)
	leaf.Unlock()
	if msg == "" {
		t.Error("a lock taken under a leaf did not panic")
	}
	// Unlocked by another goroutine: forgotten all the same.
	later.Lock()
	done := make(chan struct{})
	go func() { later.Unlock(); close(done) }()
	<-done
	if msg := panics(first.Lock); msg != "" {
		t.Errorf("after a lock given back by another goroutine: %s", msg)
	}
	first.Unlock()
}
