package syncapp

import (
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// TestAskOutlastsAShorterMark checks that a node asks for a mark that
// lasts longer than the one its key holds, and not for one the key's mark
// covers already.
func TestAskOutlastsAShorterMark(t *testing.T) {
	now := time.Now()
	n := newNearKeys()
	n.add([]strategy.NearMark{
		{Key: "short", Until: now.Add(time.Second)},
		{Key: "long", Until: now.Add(time.Hour)},
	}, 0, 100, now)

	n.ask("short", now.Add(time.Minute).UnixNano())
	n.ask("long", now.Add(time.Minute).UnixNano())
	n.ask("new", now.Add(time.Minute).UnixNano())

	got := make(map[string]time.Time)
	for _, m := range n.takeAsked() {
		got[m.Key] = m.Until
	}
	want := now.Add(time.Minute).UnixNano()
	if len(got) != 2 || got["short"].UnixNano() != want || got["new"].UnixNano() != want {
		t.Errorf("asked %v, want short and new until %v", got, now.Add(time.Minute))
	}
}
