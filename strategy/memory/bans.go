package memory

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// banEpochs numbers the epochs of every data set's bans (see
// strategy.Banner), so that a version is never reused, even by a
// namespace whose bans all ended.
var banEpochs atomic.Int64

// namespaceBans are the bans of one namespace: each key's end, in Unix
// nanoseconds, and the version of that state.
type namespaceBans struct {
	until   map[string]int64
	version int64
	// lifted is when the latest ban lifted would have ended: the version
	// stays until then (see strategy.Banner).
	lifted int64
}

// SetBans records bans of a namespace, atomically (see strategy.Banner):
// a later end wins, a zero end lifts the key's ban, an end that has
// passed changes nothing. Every change gives the namespace's bans a new
// version. Ends more than strategy.MaxBanLength away are refused, before
// anything changes, with an error that wraps strategy.ErrRejected.
func (s *Store) SetBans(ctx context.Context, namespace string, bans []strategy.Ban) (err error) {
	defer errs.SetBans(&err, namespace, len(bans))
	return s.run(ctx, strategy.CheckBans(bans, s.now()), func(d *data, now int64) {
		nb := d.bansOf(namespace, now)
		changed := false
		for _, b := range bans {
			if b.Until.IsZero() {
				if u, ok := nb.until[b.Key]; ok {
					delete(nb.until, b.Key)
					nb.lifted = max(nb.lifted, u)
					changed = true
				}
			} else if u := b.Until.UnixNano(); u > now && u > nb.until[b.Key] {
				nb.until[b.Key] = u
				changed = true
			}
		}
		if changed && nb.version == 0 {
			nb.version = banEpochs.Add(1) << strategy.BanEpochShift
		} else if changed {
			nb.version++
		}
		d.dropBansIfNone(namespace, nb)
	})
}

// dropBansIfNone forgets a namespace's bans when it holds none, and no
// lift keeps its version.
func (d *data) dropBansIfNone(namespace string, nb *namespaceBans) {
	if len(nb.until) == 0 && nb.version == 0 {
		delete(d.bans, namespace)
	}
}

// GetBans returns the version of the namespace's bans and, unless it is
// known, the bans that have not ended by now (see strategy.Banner).
func (s *Store) GetBans(ctx context.Context, namespace string, known int64, now time.Time) (bans []strategy.Ban, version int64, err error) {
	defer errs.GetBans(&err, namespace)
	err = s.run(ctx, nil, func(d *data, clock int64) {
		nb := d.bansOf(namespace, clock)
		defer d.dropBansIfNone(namespace, nb)
		if version = nb.version; version == known {
			return
		}
		for k, u := range nb.until {
			if u > now.UnixNano() {
				bans = append(bans, strategy.Ban{Key: k, Until: time.Unix(0, u)})
			}
		}
	})
	return bans, version, err
}

// bansOf returns the bans of a namespace, without those that ended by
// now (the store's clock): the ones that ended no longer count, and an
// ended ban changes no version, as in Redis, whose bans expire. A
// namespace whose bans all ended, and whose lifted ones would have,
// has version 0.
func (d *data) bansOf(namespace string, now int64) *namespaceBans {
	nb := d.bans[namespace]
	if nb == nil {
		nb = &namespaceBans{until: make(map[string]int64)}
		d.bans[namespace] = nb
	}
	for k, u := range nb.until {
		if u <= now {
			delete(nb.until, k)
		}
	}
	if len(nb.until) == 0 && nb.lifted <= now {
		nb.version, nb.lifted = 0, 0
	}
	return nb
}
