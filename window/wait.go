package window

import "time"

// Until returns how long after now (Unix nanoseconds) the window's rate
// falls to target, if no more hits come: the previous window's weight
// fades through the current window, and in the next one the current count
// fades in turn. With fixed, only the current count counts, and it ends
// with the window. A negative target, which no rate reaches, waits until
// both windows are gone. A calendar window is always fixed, and its
// period's length is its size here. It is what Retry-After,
// RateLimit-Reset and a peek's wait are computed from.
func (s Sample) Until(target float64, now int64, fixed bool) time.Duration {
	size := s.Size.Seconds()
	if IsCalendar(s.Size) {
		fixed, size = true, s.Length().Seconds()
	}
	pos := min(max(float64(now-s.Start)/1e9, 0), size) // seconds into the window
	return time.Duration(untilSeconds(s, target, size, pos, fixed) * 1e9)
}

func untilSeconds(s Sample, target, size, pos float64, fixed bool) float64 {
	left := size - pos
	if target < 0 {
		return left + size
	}
	if fixed {
		if s.Current <= target {
			return 0
		}
		return left
	}
	if s.Current <= target {
		if s.Previous <= 0 {
			return 0
		}
		// cur + prev*(size-t)/size <= target  <=>  t >= size - (target-cur)*size/prev
		t := size - (target-s.Current)*size/s.Previous
		return max(0, t-pos)
	}
	// In the next window: cur*(size-t)/size <= target.
	return left + max(0, size-target*size/s.Current)
}
