package strategy

import "context"

// Pinger is a Store that can tell, in one round trip that changes
// nothing, whether it serves: the rate_limit app asks it while the store
// is failing and a sync run had nothing else to ask, so that it learns
// soon that the store is back.
type Pinger interface {
	Store

	// Ping returns nil when the store serves every part of its data (on a
	// Redis Cluster, every master answers), and otherwise an error with
	// the conventions of Store's errors.
	Ping(ctx context.Context) error
}
