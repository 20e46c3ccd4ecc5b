package window

import (
	"math"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

// base is a minute boundary: every window size used here divides it.
var base = time.Unix(1_700_000_040, 0)

func TestWindowMath(t *testing.T) {
	for i, tc := range []struct {
		now        time.Time
		size       time.Duration
		wantStart  time.Time
		wantWeight float64
	}{
		{base, time.Minute, base, 1},
		{base.Add(30 * time.Second), time.Minute, base, 0.5},
		{base.Add(59 * time.Second), time.Minute, base, 1.0 / 60},
		{base.Add(60 * time.Second), time.Minute, base.Add(time.Minute), 1},
		{base.Add(1500 * time.Millisecond), time.Second, base.Add(time.Second), 0.5},
		{base.Add(250 * time.Millisecond), 100 * time.Millisecond, base.Add(200 * time.Millisecond), 0.5},
		{base.Add(45 * time.Minute), time.Hour, time.Unix(1_700_000_040/3600*3600, 0), 1 - float64(1_700_000_040%3600+45*60)/3600},
		{time.Unix(-1, 0), time.Minute, time.Unix(-60, 0), 1.0 / 60},
	} {
		now := tc.now.UnixNano()
		if got := Start(now, tc.size); got != tc.wantStart.UnixNano() {
			t.Errorf("Test %d: Start = %v, want %v", i, time.Unix(0, got), tc.wantStart)
		}
		if got := Weight(now, tc.size); math.Abs(got-tc.wantWeight) > 1e-12 {
			t.Errorf("Test %d: Weight = %v, want %v", i, got, tc.wantWeight)
		}
	}
}

func TestValidateSize(t *testing.T) {
	for _, size := range []time.Duration{time.Nanosecond, time.Millisecond, time.Second, 30 * 24 * time.Hour} {
		if err := ValidateSize(size); err != nil {
			t.Errorf("ValidateSize(%v) = %v", size, err)
		}
	}
	for _, size := range []time.Duration{0, -time.Second} {
		if err := ValidateSize(size); err == nil {
			t.Errorf("ValidateSize(%v) accepted", size)
		}
	}
}

// TestKongExample is the reference's worked example: 10 hits in the current
// minute, 40 in the previous one, 30 seconds in: 10 + 40*0.5 = 30.
func TestKongExample(t *testing.T) {
	clock := fakeclock.New(base.Add(-30 * time.Second))
	z := mustZone(t, 100, clock)
	ns := mustNamespace(t, z, "kong")
	ns.Increment("1.2.3.4", time.Minute, 40)
	clock.Set(base.Add(30 * time.Second))
	s := ns.Increment("1.2.3.4", time.Minute, 10)
	if s.Current != 10 || s.Previous != 40 || s.Weight != 0.5 {
		t.Fatalf("sample = %+v, want current 10, previous 40, weight 0.5", s)
	}
	if got := s.Sliding(); got != 30 {
		t.Fatalf("sliding rate = %v, want 30", got)
	}
	if got := s.Rate(true); got != 10 {
		t.Fatalf("fixed rate = %v, want 10", got)
	}
	if got := ns.Read("1.2.3.4", time.Minute).Sliding(); got != 30 {
		t.Fatalf("read rate = %v, want 30", got)
	}
}

func TestSlidingRateOverTime(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	ns := mustNamespace(t, z, "t")
	for range 60 {
		ns.Increment("k", time.Minute, 1)
	}
	for i, tc := range []struct {
		at      time.Duration
		sliding float64
		fixed   float64
	}{
		{0, 60, 60},
		{59 * time.Second, 60, 60},
		{60 * time.Second, 60, 0}, // new window: previous weighs 1
		{75 * time.Second, 45, 0},
		{90 * time.Second, 30, 0},
		{119 * time.Second, 1, 0},
		{120 * time.Second, 0, 0}, // two windows later nothing is left
		{10 * time.Minute, 0, 0},
	} {
		clock.Set(base.Add(tc.at))
		s := ns.Read("k", time.Minute)
		if math.Abs(s.Sliding()-tc.sliding) > 1e-9 || s.Rate(true) != tc.fixed {
			t.Errorf("Test %d (+%v): sliding %v fixed %v, want %v and %v", i, tc.at, s.Sliding(), s.Rate(true), tc.sliding, tc.fixed)
		}
	}
}

func TestFractionalValues(t *testing.T) {
	clock := fakeclock.New(base)
	ns := mustNamespace(t, mustZone(t, 10, clock), "f")
	var s Sample
	for range 7 {
		s = ns.Increment("k", time.Second, 0.5)
	}
	s = ns.Increment("k", time.Second, 10.25)
	if s.Current != 13.75 {
		t.Fatalf("current = %v, want 13.75", s.Current)
	}
	s = ns.Increment("k", time.Second, -0.25)
	if s.Current != 13.5 {
		t.Fatalf("after a negative value current = %v, want 13.5", s.Current)
	}
}

// TestExactlyNPerWindow checks the contract that, starting empty, a limit
// of N admits exactly N hits in one window when rate > limit rejects.
func TestExactlyNPerWindow(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		clock := fakeclock.New(base.Add(400 * time.Millisecond))
		ns := mustNamespace(t, mustZone(t, 10, clock), "n")
		admitted := 0
		for range 25 {
			if ns.Increment("k", time.Second, 1).Rate(fixed) <= 10 {
				admitted++
			}
		}
		if admitted != 10 {
			t.Errorf("fixed=%v: admitted %d, want 10", fixed, admitted)
		}
	}
}

func TestWindowSizesAreSeparate(t *testing.T) {
	clock := fakeclock.New(base)
	ns := mustNamespace(t, mustZone(t, 10, clock), "w")
	ns.Increment("k", time.Second, 1)
	ns.Increment("k", time.Minute, 2)
	ns.Increment("k", time.Hour, 3)
	ns.Increment("k", 100*time.Millisecond, 4)
	for size, want := range map[time.Duration]float64{time.Second: 1, time.Minute: 2, time.Hour: 3, 100 * time.Millisecond: 4, 24 * time.Hour: 0} {
		if got := ns.Read("k", size).Current; got != want {
			t.Errorf("size %v: current %v, want %v", size, got, want)
		}
	}
}

func TestReadWithDiff(t *testing.T) {
	clock := fakeclock.New(base.Add(30 * time.Second))
	ns := mustNamespace(t, mustZone(t, 10, clock), "r")
	ns.SetTracked(true)
	ns.Increment("k", time.Minute, 5)
	ns.Take() // the 5 are now synced
	ns.Increment("k", time.Minute, 3)
	if got := ns.ReadWithDiff("k", time.Minute, 10).Current; got != 15 {
		t.Fatalf("current with diff 10 = %v, want 15 (5 synced + 10)", got)
	}
	if got := ns.Read("k", time.Minute).Current; got != 8 {
		t.Fatalf("ReadWithDiff changed the counter: current %v, want 8", got)
	}
	if got := ns.ReadWithDiff("unknown", time.Minute, 2).Current; got != 2 {
		t.Fatalf("unknown key with diff 2 = %v, want 2", got)
	}
}

func mustZone(t testing.TB, maxKeys int, clock *fakeclock.Clock) *Zone {
	t.Helper()
	var c Clock
	if clock != nil {
		c = clock.UnixNano
	}
	z, err := NewZone(maxKeys, c)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

func mustNamespace(t testing.TB, z *Zone, name string) *Namespace {
	t.Helper()
	ns, err := z.Namespace(name)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
