package syncapp

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Ban bans key until the given time: on this node at once, and, where the
// namespace's store can hold bans (strategy.Banner), in the store with the
// next sync run, so that the other nodes learn of it with theirs. A later
// Ban of a key already banned keeps the later end.
//
// A node holds at most as many bans as its zone holds keys; past that, it
// drops the bans that ended, and then any one, to make room.
func (n *Namespace) Ban(ctx context.Context, key string, until time.Time) {
	n.bans.ban(key, until.UnixNano(), n.banner != nil, n.counters.Zone().Capacity())
}

// BannedUntil returns when key's ban ends, or the zero time when the key is
// not banned or its ban has ended. It reads this node's memory only, and
// costs an atomic load when the namespace holds no ban.
func (n *Namespace) BannedUntil(key string) time.Time { return n.bans.bannedUntil(key) }

// BansAcrossNodes reports whether the namespace shares its bans with the
// fleet through its store: false in a local namespace, and with a store
// that cannot hold bans, where each node bans on its own.
func (n *Namespace) BansAcrossNodes() bool { return n.banner != nil }

// UseBans tells the namespace that a handler bans keys in it, so that its
// sync runs read the store's bans (one more round trip per run): a
// namespace no handler of the running config bans in reads none.
func (n *Namespace) UseBans() { n.runner.useBans() }

// banClockMargin is how far apart the clocks of a node and its store may
// be: a ban that ends within it is not written back to a store that lost
// its bans.
const banClockMargin = time.Second

// banSweepInterval is how often a ban drops the bans that ended, so that
// the bans of keys never seen again do not stay in memory (and keep
// bannedUntil off its lock-free path) until the table is full.
const banSweepInterval = time.Minute

// banTable is what a node knows of a namespace's bans. It is part of the
// namespace's fleetState, so bans outlive reloads.
type banTable struct {
	name   string
	logger *zap.Logger

	// held is len(until), read without the lock by bannedUntil.
	held atomic.Int64

	mu lockorder.RWMutex[banTableLock]
	// until maps each banned key to the end of its ban, in Unix
	// nanoseconds.
	until map[string]int64
	// pending are the bans (or lifts, 0) to push to the store.
	pending map[string]int64
	// version is the store's version of the bans until holds from it, or
	// -1 before the first read.
	version int64
	// dropped counts the bans dropped to make room.
	dropped int64
	// swept is when ban last dropped the bans that ended, in Unix
	// nanoseconds.
	swept int64
}

func newBanTable(name string, logger *zap.Logger) *banTable {
	return &banTable{name: name, logger: logger, until: make(map[string]int64), pending: make(map[string]int64), version: -1}
}

func (t *banTable) ban(key string, until int64, push bool, capacity int) {
	now := time.Now().UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if until <= t.until[key] {
		return
	}
	if now-t.swept >= int64(banSweepInterval) {
		t.dropEnded(now)
	}
	if _, ok := t.until[key]; !ok && len(t.until) >= capacity {
		t.makeRoom(now, capacity)
	}
	t.until[key] = until
	t.held.Store(int64(len(t.until)))
	if push {
		t.pending[key] = until
	}
}

// dropEnded drops the bans that ended by now, with their pushes: a ban
// that ended bans nothing anywhere. The caller holds the lock.
func (t *banTable) dropEnded(now int64) {
	for k, u := range t.until {
		if u <= now {
			t.drop(k)
		}
	}
	t.swept = now
}

// makeRoom drops the bans that ended, and if that leaves capacity or
// more, one ban, whichever map iteration meets first. The caller holds the
// lock.
func (t *banTable) makeRoom(now int64, capacity int) {
	t.dropEnded(now)
	for k := range t.until {
		if len(t.until) < capacity {
			break
		}
		t.drop(k)
		t.dropped++
	}
}

func (t *banTable) bannedUntil(key string) time.Time {
	if t.held.Load() == 0 {
		return time.Time{}
	}
	t.mu.RLock()
	u, ok := t.until[key]
	t.mu.RUnlock()
	if !ok {
		return time.Time{}
	}
	if u <= time.Now().UnixNano() {
		t.forget(key, u)
		return time.Time{}
	}
	return time.Unix(0, u)
}

// forget drops key's ban that ended at until, unless a later one replaced
// it meanwhile: a banned key that comes back after its ban costs the lock
// once, not on every request.
func (t *banTable) forget(key string, until int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.until[key] == until {
		t.drop(key)
	}
}

// drop removes key's ban and its pending push, if any. The caller holds
// the lock.
func (t *banTable) drop(key string) {
	delete(t.until, key)
	delete(t.pending, key)
	t.held.Store(int64(len(t.until)))
}

// active returns the bans that have not ended by now (Unix nanoseconds),
// latest end first, at most limit of them, and how many there are.
func (t *banTable) active(now int64, limit int) (bans []strategy.Ban, total int) {
	t.mu.RLock()
	for k, u := range t.until {
		if u > now {
			bans = append(bans, strategy.Ban{Key: k, Until: time.Unix(0, u)})
		}
	}
	t.mu.RUnlock()
	slices.SortFunc(bans, func(a, b strategy.Ban) int {
		return cmp.Or(b.Until.Compare(a.Until), strings.Compare(a.Key, b.Key))
	})
	return bans[:min(limit, len(bans))], len(bans)
}

// lift ends key's ban on this node.
func (t *banTable) lift(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.drop(key)
}

// inForce returns the number of bans that have not ended by now (Unix
// nanoseconds): what the metrics and the admin API report. A ban that ended
// stays in memory until a later ban sweeps, or its key comes back.
func (t *banTable) inForce(now int64) (n int) {
	if t.held.Load() == 0 {
		return 0
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, u := range t.until {
		if u > now {
			n++
		}
	}
	return n
}

// droppedCount returns the number of bans dropped to make room.
func (t *banTable) droppedCount() int64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.dropped
}

// sync pushes the bans this node started since the last sync to banner
// and reads the store's, unless its version is the one this node holds:
// one round trip when no ban is pending, three when some are. Bans the store
// refuses are dropped, logged; on any other error they are pushed again
// with the next sync.
//
// A store that answers version 0 while this node holds bans that have
// not ended lost its bans (a Redis restarted empty): a lift keeps a
// version until the lifted ban would have ended (strategy.Banner), and
// the node's own bans are pushed before it reads. So does one that
// answers a version of another epoch than the one this node knew (see
// lostBans): another node wrote back the bans it held first. The node
// writes the bans it holds back. A node with bans to push asks first (one more
// round trip, in the rare runs that push bans): its push would give the
// store a new version, which the fleet would take for the whole of the
// bans, and the lost ones would be dropped everywhere. Whether the node
// ever read a version does not matter: a node whose push landed but
// whose read failed (the store died between them) holds bans the store
// had.
func (t *banTable) sync(ctx context.Context, banner strategy.Banner) error {
	t.mu.Lock()
	var push []strategy.Ban
	for k, u := range t.pending {
		push = append(push, strategy.Ban{Key: k, Until: time.Unix(0, u)})
	}
	clear(t.pending)
	known := t.version
	t.mu.Unlock()

	wroteBack := false
	if len(push) > 0 {
		_, version, err := banner.GetBans(ctx, t.name, known, time.Now())
		if err != nil {
			t.repend(push)
			return err
		}
		if lostBans(known, version) {
			push, wroteBack = t.writeBack(push), true
		}
	}
	if len(push) > 0 {
		switch err := banner.SetBans(ctx, t.name, push); {
		case errors.Is(err, strategy.ErrRejected):
			t.logger.Error("the store refused bans: they hold on this node only", zap.String("namespace", t.name), zap.Error(err))
		case err != nil:
			t.repend(push)
			return err
		}
	}
	bans, version, err := banner.GetBans(ctx, t.name, known, time.Now())
	if err != nil {
		return err
	}
	if !wroteBack && lostBans(known, version) {
		if held := t.writeBack(nil); len(held) > 0 {
			if err := banner.SetBans(ctx, t.name, held); err != nil {
				return err
			}
			if bans, version, err = banner.GetBans(ctx, t.name, 0, time.Now()); err != nil {
				return err
			}
		}
	}
	if version != known {
		t.replace(bans, version)
	}
	return nil
}

// lostBans reports whether a store whose bans this node knew at version
// known, and reads at version, lost them: it reads version 0, or a
// version of another epoch (strategy.BanEpoch), which a store starts only
// at version 0, so that another node wrote some bans back before this
// one looked. The bans this node holds then go back, whoever else wrote
// some.
func lostBans(known, version int64) bool {
	return version == 0 || known > 0 && strategy.BanEpoch(version) != strategy.BanEpoch(known)
}

// writeBack returns push with the bans this node holds that end more
// than banClockMargin from now, for a store that lost its bans, and logs
// it when there are any besides those of push (a store that never held a
// ban reads as one that lost them: the node's first bans are no loss).
// Bans about to end are left to end: a store whose clock is ahead may
// have expired them already, and would refuse them at every run.
func (t *banTable) writeBack(push []strategy.Ban) []strategy.Ban {
	held, _ := t.active(time.Now().Add(banClockMargin).UnixNano(), math.MaxInt)
	held = slices.DeleteFunc(held, func(b strategy.Ban) bool {
		return slices.ContainsFunc(push, func(p strategy.Ban) bool { return p.Key == b.Key })
	})
	if len(held) == 0 {
		return push
	}
	t.logger.Warn("the store had lost the bans in force: writing back those this node holds",
		zap.String("namespace", t.name), zap.Int("bans", len(held)))
	return append(push, held...)
}

// repend puts back bans whose push failed, unless a later one came since.
func (t *banTable) repend(bans []strategy.Ban) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range bans {
		if _, newer := t.pending[b.Key]; !newer {
			t.pending[b.Key] = b.Until.UnixNano()
		}
	}
}

// replace takes the store's bans as this node's, keeping the bans still
// to push: a ban another node started appears, and one lifted anywhere is
// gone.
func (t *banTable) replace(bans []strategy.Ban, version int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.until)
	for _, b := range bans {
		t.until[b.Key] = b.Until.UnixNano()
	}
	for k, u := range t.pending {
		if u > t.until[k] {
			t.until[k] = u
		}
	}
	t.version = version
	t.held.Store(int64(len(t.until)))
}
