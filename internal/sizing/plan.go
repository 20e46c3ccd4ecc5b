package sizing

import "time"

// QuickPlan is the default subset of the grid, about 20 minutes of
// machine time on 2 cores (the page shows the whole grid): every sync mode at 1 and 3 nodes with 1,000 and
// 10,000 keys on Redis, 10 nodes and 100,000 keys in each mode on Redis,
// and on PostgreSQL each mode at 1 and 3 nodes with 1,000 keys, plus 10
// nodes and 100,000 keys periodic.
func QuickPlan(stores []string, maxRate float64) []Row {
	type cell struct {
		nodes, keys int
		syncs       []time.Duration
	}
	all := SyncRates
	periodic := SyncRates[:2]
	plans := map[string][]cell{
		"redis": {
			{1, 1000, all}, {1, 10000, all}, {3, 1000, all}, {3, 10000, all},
			{3, 100000, all}, {10, 1000, all}, {10, 100000, periodic},
		},
		"postgres": {
			{1, 1000, all}, {3, 1000, all}, {3, 100000, periodic}, {10, 1000, periodic},
		},
	}
	var rows []Row
	for _, st := range stores {
		for _, c := range plans[st] {
			for _, s := range c.syncs {
				rows = append(rows, Row{Store: st, Nodes: c.nodes, Keys: c.keys, SyncRate: s, Rate: RateFor(c.keys, maxRate)})
			}
		}
	}
	return rows
}
