package window

import "github.com/ratesync/caddy-ratelimit/internal/lockorder"

// The classes of the package's locks (see internal/lockorder): a zone's
// shards, each locked alone but by a resize, which holds the old ones
// while it fills the new; and its namespaces' names, a leaf.
type (
	shardLock struct{}
	namesLock struct{}
)

var _ = lockorder.Order("window.shardLock < window.shardLock")
