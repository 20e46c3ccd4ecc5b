package memory_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/memory"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
	"github.com/ratesync/caddy-ratelimit/window"
)

// uniqueName returns a data set name no other test (or run, with -count)
// uses.
func uniqueName(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "-" + hex.EncodeToString(b[:])
}

// open opens a store of the named data set through the module, as the
// rate_limit app does.
func open(t *testing.T, name string) *memory.Store {
	t.Helper()
	s, err := (&memory.Memory{Name: name}).OpenStore()
	if err != nil {
		t.Fatalf("opening a store: %v", err)
	}
	return s.(*memory.Store)
}

func counters(t *testing.T, s strategy.Store, namespace string) int {
	return s.(*memory.Store).Counters(namespace)
}

func slots(t *testing.T, s strategy.Store, namespace string) int {
	return s.(*memory.Store).Slots(namespace)
}

// TestConformance runs the store suite over stores of one named data set,
// as the nodes of a cluster share one server.
func TestConformance(t *testing.T) {
	name := uniqueName(t)
	probe := open(t, name) // reads the data set's lookups
	strategytest.Run(t, strategytest.Harness{
		Open:     func(t *testing.T) strategy.Store { return open(t, name) },
		Counters: counters,
		Cost:     func(*testing.T) int64 { return probe.Lookups() },
		Slots:    slots,
		Rates:    func(_ *testing.T, s strategy.Store, ns string) int { return s.(*memory.Store).RateKeys(ns) },
	})
}

func TestSameNameSharesCounters(t *testing.T) {
	ctx := t.Context()
	name := uniqueName(t)
	a, b, other := open(t, name), open(t, name), open(t, name+"-other")
	now := time.Now()
	start := window.Start(now.UnixNano(), time.Hour)
	d := window.Diff{Key: "k", Size: time.Hour, Start: start, Value: 2}
	if err := a.PushDiffs(ctx, strategy.Batch{ID: "1", Namespace: "ns", Diffs: []window.Diff{d}}); err != nil {
		t.Fatal(err)
	}
	// A hit through b counts on top of a's push, and a sees it.
	ws := []strategy.WindowHit{{Size: time.Hour, Start: start, Value: 1, Max: 10}}
	if got, _, err := b.Hit(ctx, "ns", "k", "", ws, false); err != nil || got[0].Current != 3 {
		t.Fatalf("hitting through a second store of the name: got %v, %v; want a count of 3", got, err)
	}
	value := func(s *memory.Store) float64 {
		t.Helper()
		counts, err := s.GetCounters(ctx, "ns", []string{"k"}, []time.Duration{time.Hour}, now)
		if err != nil {
			t.Fatal(err)
		}
		var v float64
		for _, c := range counts {
			if c.Start == start {
				v += c.Value
			}
		}
		return v
	}
	if v := value(a); v != 3 {
		t.Errorf("the first store sees %v, want 3", v)
	}
	if v := value(other); v != 0 {
		t.Errorf("a store of another name sees %v, want nothing", v)
	}
	// Closing one store leaves the others of its data set working.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if v := value(b); v != 3 {
		t.Errorf("after the first store closed, the second sees %v, want 3", v)
	}
	// A store opened later, even after every other closed, finds the data.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if v := value(open(t, name)); v != 3 {
		t.Errorf("a store opened later sees %v, want 3", v)
	}
	if a.Lookups() != b.Lookups() || a.Lookups() == 0 {
		t.Errorf("stores of one name count %d and %d lookups, want one non-zero total", a.Lookups(), b.Lookups())
	}
	if other.Lookups() != 1*2 {
		t.Errorf("a store of another name counts %d lookups, want 2 (one key, one size, two windows)", other.Lookups())
	}
}

func TestModuleJSON(t *testing.T) {
	info, err := caddy.GetModule("rate_limit.strategies.memory")
	if err != nil {
		t.Fatal(err)
	}
	if info.ID.Namespace() != strategy.Namespace {
		t.Errorf("module namespace %q, want %q", info.ID.Namespace(), strategy.Namespace)
	}
	for _, tc := range []struct {
		json, name string
	}{
		{`{}`, ""},
		{`{"name": "shared"}`, "shared"},
	} {
		mod := info.New()
		if err := caddy.StrictUnmarshalJSON([]byte(tc.json), mod); err != nil {
			t.Fatalf("unmarshaling %s: %v", tc.json, err)
		}
		m, ok := mod.(*memory.Memory)
		if !ok {
			t.Fatalf("the module is a %T, not a *memory.Memory", mod)
		}
		if m.Name != tc.name || m.StoreKey() != tc.name {
			t.Errorf("%s: name %q and store key %q, want %q", tc.json, m.Name, m.StoreKey(), tc.name)
		}
	}
	if err := caddy.StrictUnmarshalJSON([]byte(`{"nmae": "x"}`), info.New()); err == nil {
		t.Error("an unknown field was accepted")
	}
}

func TestCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input, name, err string
	}{
		{input: "memory", name: ""},
		{input: "memory shared", name: "shared"},
		{input: "memory {\n\tname shared\n}", name: "shared"},
		{input: "memory a b", err: "wrong argument count"},
		{input: "memory {\n\tname\n}", err: "wrong argument count"},
		{input: "memory {\n\tname a b\n}", err: "wrong argument count"},
		{input: "memory a {\n\tname b\n}", err: "already set"},
		{input: "memory {\n\tbogus\n}", err: "unrecognized subdirective 'bogus'"},
	} {
		var m memory.Memory
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.input, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: got error %v, want one that says %q", tc.input, err, tc.err)
		case tc.err == "" && m.Name != tc.name:
			t.Errorf("%q: name %q, want %q", tc.input, m.Name, tc.name)
		}
	}
}

func TestValidateWindow(t *testing.T) {
	var m memory.Memory
	for _, size := range []time.Duration{time.Millisecond, time.Second, time.Hour, 7 * 24 * time.Hour} {
		if err := m.ValidateWindow(size); err != nil {
			t.Errorf("size %v: %v", size, err)
		}
	}
	for _, size := range []time.Duration{0, -time.Second, time.Microsecond, 1500 * time.Microsecond} {
		err := m.ValidateWindow(size)
		if !errors.Is(err, memory.ErrInvalidWindow) || !errors.Is(err, strategy.ErrInvalidWindow) || !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("size %v: got error %v, want one that wraps ErrInvalidWindow", size, err)
			continue
		}
		if !strings.Contains(err.Error(), size.String()) {
			t.Errorf("size %v: the error %q does not name the size", size, err)
		}
	}
}

func TestInputErrors(t *testing.T) {
	s := open(t, uniqueName(t))
	ctx := t.Context()
	start := window.Start(time.Now().UnixNano(), time.Hour)
	d := window.Diff{Key: "k", Size: time.Hour, Start: start, Value: 1}

	err := s.PushDiffs(ctx, strategy.Batch{Namespace: "ns", Diffs: []window.Diff{d}})
	if !errors.Is(err, strategy.ErrRejected) {
		t.Errorf("a batch without an ID: got error %v, want one that wraps ErrRejected", err)
	}
	bad := d
	bad.Size = 1500 * time.Microsecond
	bad.Start = 0
	err = s.PushDiffs(ctx, strategy.Batch{ID: "1", Namespace: "ns", Diffs: []window.Diff{d, bad}})
	if !errors.Is(err, memory.ErrInvalidWindow) {
		t.Errorf("a diff of a window that is not whole milliseconds: got error %v, want one that wraps ErrInvalidWindow", err)
	}
	ws := []strategy.WindowHit{{Size: time.Hour, Start: start, Value: 1, Max: 10}}
	if _, _, err := s.Hit(ctx, "ns", "k", strings.Repeat("x", 257), ws, false); !errors.Is(err, strategy.ErrRejected) {
		t.Errorf("a hit ID of 257 bytes: got error %v, want one that wraps ErrRejected", err)
	}
	// A batch refused whole applies none of its diffs.
	if n := s.Counters("ns"); n != 0 {
		t.Errorf("refused calls left %d counters, want 0", n)
	}

	// A call with a context that is done applies nothing, and says so.
	done, cancel := context.WithCancel(ctx)
	cancel()
	err = s.PushDiffs(done, strategy.Batch{ID: "2", Namespace: "ns", Diffs: []window.Diff{d}})
	if !errors.Is(err, strategy.ErrNotSent) || !errors.Is(err, context.Canceled) {
		t.Errorf("a push with a cancelled context: got error %v, want one that wraps ErrNotSent and context.Canceled", err)
	}
	if _, _, err := s.Hit(done, "ns", "k", "", ws, false); !errors.Is(err, strategy.ErrNotSent) {
		t.Errorf("a hit with a cancelled context: got error %v, want one that wraps ErrNotSent", err)
	}
	if n := s.Counters("ns"); n != 0 {
		t.Errorf("calls with a cancelled context left %d counters, want 0", n)
	}
	// The batch was not applied, so its ID is free.
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "2", Namespace: "ns", Diffs: []window.Diff{d}}); err != nil {
		t.Fatal(err)
	}
	if n := s.Counters("ns"); n != 1 {
		t.Errorf("the batch pushed after a cancelled attempt left %d counters, want 1", n)
	}
}

func TestCloseTwice(t *testing.T) {
	s := open(t, uniqueName(t))
	for range 2 {
		if err := s.Close(); err != nil {
			t.Fatalf("closing: %v", err)
		}
	}
}
