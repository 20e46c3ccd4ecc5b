package sizing

import "math"

// Fit returns the constants that fit the measured rows of one store best:
// the CPU per command, per round trip and per beat, and when idle, by least
// squares on the measured work; the bytes per counter, per marker, per connection (Redis) and of the empty tables (PostgreSQL) on the
// predicted items held; the trip latency from the synchronous rows' round
// trips; and the connections per node, the mean of each mode's rows.
// Constants the rows cannot tell (no synchronous row, say) keep def's
// values.
func Fit(rows []Measured, def Constants) Constants {
	c := def
	// The trip latency first: the other predictions use it.
	var lat []float64
	for _, m := range rows {
		if m.Row.SyncRate == 0 && m.Trips > 0 {
			perNode := m.Row.Rate / float64(m.Row.Nodes)
			trips := m.Trips / float64(m.Row.Nodes)
			if trips < perNode {
				lat = append(lat, (perNode/trips-1)/perNode*1e6)
			} else {
				lat = append(lat, 0)
			}
		}
	}
	if len(lat) > 0 {
		c.TripLatency = mean(lat)
	}
	var connsP []float64
	var sync []Measured
	for _, m := range rows {
		if m.Row.SyncRate > 0 {
			connsP = append(connsP, float64(m.Conns)/float64(m.Row.Nodes))
		} else if m.Conns > 0 {
			sync = append(sync, m)
		}
	}
	if len(connsP) > 0 {
		c.ConnsPeriodic = mean(connsP)
	}
	if len(sync) > 0 {
		c.ConnsOverlap = fitOverlap(sync, c)
	}
	// PostgreSQL's purges: what the transactions measured exceed the
	// calls predicted by, per node and purge, in the periodic rows, whose
	// calls the code alone tells.
	var purge []float64
	c.PurgeTrips = 0
	for _, m := range rows {
		if m.Row.Store == "postgres" && m.Row.SyncRate > 0 {
			p := Predict(m.Row, c, m.Elapsed)
			purge = append(purge, (m.Commands-p.Commands)*PostgresPurge.Seconds()/float64(m.Row.Nodes))
		}
	}
	if len(purge) > 0 {
		c.PurgeTrips = max(mean(purge), 0)
	}
	var cpuX, memX [][]float64
	var cpuY, memY []float64
	for _, m := range rows {
		p := Predict(m.Row, c, m.Elapsed)
		units := p.Commands
		if m.Row.Store == "postgres" {
			units = p.Rows
		}
		cpuX = append(cpuX, []float64{units, p.Calls, 1e4, p.Conns * 1e4, p.Beats})
		cpuY = append(cpuY, m.CPU/100*1e6)
		conns, empty := p.Conns, 0.0
		if m.Row.Store == "postgres" {
			conns, empty = 0, 1
		}
		pm := Predict(m.Row, c, m.memoryAt()) // as PredictMemory
		memX = append(memX, []float64{pm.Counters, pm.Markers, conns, empty, pm.Updates})
		memY = append(memY, m.Memory)
	}
	if k, ok := FitNonNeg(cpuX, cpuY); ok {
		c.CPUPerCommand, c.CPUPerTrip, c.CPUIdle, c.CPUPerConn, c.CPUPerBeat = k[0], k[1], k[2], k[3], k[4]
	}
	if k, ok := FitNonNeg(memX, memY); ok {
		c.BytesPerCounter, c.BytesPerMarker, c.BytesPerConn, c.BytesEmpty, c.BytesPerUpdate = k[0], k[1], k[2], k[3], k[4]
	}
	return c
}

// fitOverlap returns the ConnsOverlap, from 0 to 10⁴ calls a second, whose
// predicted connections have the least sum of squared relative errors
// against the synchronous rows': a scan of a log scale in steps of 5 %.
func fitOverlap(rows []Measured, c Constants) float64 {
	cost := func(k float64) float64 {
		c.ConnsOverlap = k
		var sum float64
		for _, m := range rows {
			p := float64(m.Row.Nodes) * syncConns(m.Row.Rate/float64(m.Row.Nodes), c, m.Elapsed)
			e := p/float64(m.Conns) - 1
			sum += e * e
		}
		return sum
	}
	best, bestCost := 0.0, cost(0)
	for k := 1e-3; k <= 1e4; k *= 1.05 {
		if v := cost(k); v < bestCost {
			best, bestCost = k, v
		}
	}
	return best
}

// FitNonNeg returns the non-negative coefficients k that minimize the sum
// of the squared relative errors of Σ k[j]·x[i][j] against y[i] (relative,
// so that small rows weigh as much as big ones; rows with y ≤ 0 are left
// out), and false when no row tells anything. A coefficient that the
// unconstrained fit makes negative is set to 0 and the rest fitted again.
func FitNonNeg(x [][]float64, y []float64) ([]float64, bool) {
	if len(x) == 0 {
		return nil, false
	}
	n := len(x[0])
	active := make([]bool, n)
	for j := range active {
		active[j] = true
	}
	for range n + 1 {
		k, ok := solve(x, y, active)
		if !ok {
			return nil, false
		}
		worst, at := 0.0, -1
		for j, v := range k {
			if active[j] && v < worst {
				worst, at = v, j
			}
		}
		if at < 0 {
			return k, true
		}
		active[at] = false
	}
	return nil, false
}

// solve is the weighted least squares of FitNonNeg over the active
// coefficients, the others 0.
func solve(x [][]float64, y []float64, active []bool) ([]float64, bool) {
	var idx []int
	for j, a := range active {
		if a {
			idx = append(idx, j)
		}
	}
	m := len(idx)
	if m == 0 {
		return nil, false
	}
	// Normal equations A k = b, weight 1/y².
	a := make([][]float64, m)
	for i := range a {
		a[i] = make([]float64, m+1)
	}
	rows := 0
	for i := range x {
		if y[i] <= 0 {
			continue
		}
		rows++
		w := 1 / (y[i] * y[i])
		for p, jp := range idx {
			for q, jq := range idx {
				a[p][q] += w * x[i][jp] * x[i][jq]
			}
			a[p][m] += w * x[i][jp] * y[i]
		}
	}
	if rows == 0 {
		return nil, false
	}
	// Gaussian elimination with partial pivoting; a column without
	// information (all zeros) gets 0.
	k := make([]float64, len(active))
	for col := range m {
		piv := col
		for r := col + 1; r < m; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		a[col], a[piv] = a[piv], a[col]
		if math.Abs(a[col][col]) < 1e-300 {
			continue
		}
		for r := range m {
			if r == col || a[r][col] == 0 {
				continue
			}
			f := a[r][col] / a[col][col]
			for c := col; c <= m; c++ {
				a[r][c] -= f * a[col][c]
			}
		}
	}
	for p, j := range idx {
		if math.Abs(a[p][p]) >= 1e-300 {
			k[j] = a[p][m] / a[p][p]
		}
	}
	return k, true
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
