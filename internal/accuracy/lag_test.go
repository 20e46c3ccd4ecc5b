package accuracy

import (
	"testing"
	"time"
)

// The lag check explains an admission past the limit by the other nodes'
// hits since the last push whose fetch the node had back, and only by
// those.
func TestCheckLag(t *testing.T) {
	const limit, start = 3, 1000 // a window starting at 1000ms
	admit := func(ms int64, node int) Result {
		return Result{Request: Request{Node: node}, Status: 200, ServerMs: ms}
	}
	full := []Result{admit(1001, 0), admit(1002, 0), admit(1003, 0)} // node 1 reaches the limit
	for _, tc := range []struct {
		name string
		last Result
		want int // unexplained
	}{
		// Node 2 has not fetched node 1's hits yet: they were pushed at
		// 1100 at the earliest.
		{"the other node, before the next push", admit(1050, 1), 0},
		// The push at 1100 is fetched a beat later (10ms), and the fetch
		// is taken as back 2ms after that: at 1111 the hits are unseen.
		{"the other node, while fetching", admit(1111, 1), 0},
		{"the other node, after the fetch", admit(1150, 1), 1},
		// A node always sees its own hits.
		{"the same node", admit(1004, 0), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs := append([]Result{tc.last}, full...) // in any order
			checked, bad := checkLag(reqs, 0, start, limit, 100*time.Millisecond)
			if checked != 1 {
				t.Fatalf("checked %d admissions past the limit, want 1", checked)
			}
			if len(bad) != tc.want {
				t.Fatalf("unexplained: %v, want %d", bad, tc.want)
			}
			if tc.want > 0 {
				want := Unexplained{Key: 0, AtMs: tc.last.ServerMs - start, Node: tc.last.Node, Before: 3, Unseen: 0}
				if bad[0] != want {
					t.Fatalf("unexplained %+v, want %+v", bad[0], want)
				}
			}
		})
	}
	if checked, _ := checkLag(full, 0, start, limit, 100*time.Millisecond); checked != 0 {
		t.Fatalf("checked %d admissions within the limit", checked)
	}
}
