package window

import (
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

// FuzzKeyIsolation checks that no two distinct (namespace, key) pairs share
// a counter, whatever bytes they hold: separators, braces, invalid UTF-8,
// empty strings, long keys.
func FuzzKeyIsolation(f *testing.F) {
	f.Add("a", "k", "a", "k2")
	f.Add("a:b", "c", "a", "b:c")
	f.Add("ns", "{tag}x", "ns", "{tag}y")
	f.Add("", "", "", "\x00")
	f.Add("n", "\xff\xfe", "n", "\xff")
	f.Add("n", "k", "m", "k")
	f.Add("n", string(make([]byte, 4096)), "n", string(make([]byte, 4095)))
	f.Fuzz(func(t *testing.T, ns1, key1, ns2, key2 string) {
		z := mustZone(t, 64, fakeclock.New(base))
		a := mustNamespace(t, z, ns1)
		b := mustNamespace(t, z, ns2)
		a.Increment(key1, time.Minute, 1)
		b.Increment(key2, time.Minute, 2)
		same := ns1 == ns2 && key1 == key2
		gotA := a.Read(key1, time.Minute).Current
		gotB := b.Read(key2, time.Minute).Current
		if same {
			if gotA != 3 || gotB != 3 {
				t.Fatalf("same counter read %v and %v, want 3", gotA, gotB)
			}
			return
		}
		if gotA != 1 || gotB != 2 {
			t.Fatalf("(%q, %q) = %v and (%q, %q) = %v: counters collided", ns1, key1, gotA, ns2, key2, gotB)
		}
	})
}
