// Package redis is the Redis storage strategy of the rate limiter: the Caddy
// module rate_limit.strategies.redis. It keeps the shared counters, rates,
// concurrency slots, bans and near-limit marks of every node in one Redis
// deployment (a standalone server, a Sentinel-managed primary, or a Redis
// Cluster) through go-redis, which chooses the deployment from the
// settings: several addresses are a Cluster's seeds, unless master_name
// is set, which makes them Sentinels.
//
// The storage format (every key's name, type, value and expiry, and what
// each script reads and writes) is specified in docs/stores.md, under
// "Redis keys". Nodes share counters when they name the same Redis
// database and the same key_prefix.
//
// # Settings and stores
//
// Redis is the settings, a strategy.Strategy: provisioning it replaces
// placeholders, applies defaults, checks the values and reads the TLS
// files, and it holds no connection. StoreKey is every setting (after
// placeholders and defaults) and a digest of the TLS files' contents, so
// the namespaces and configs that name the same settings share one Store,
// and a changed certificate opens a new one. OpenStore returns a Store
// with a go-redis client of its own, which dials when first used, never
// before; the rate_limit app closes it with Close. From Go, Open does
// what Provision and OpenStore do, without Caddy. ValidateWindow refuses
// a window size that is not a positive whole number of milliseconds, with
// an error that wraps ErrInvalidWindow.
//
// # Capabilities
//
// *Store implements strategy.Store (PushDiffs, GetCounters, Reset, Close)
// and these optional capabilities of package strategy:
//
//   - Hitter and BatchHitter: synchronous hits (sync_rate 0), one at a
//     time or several of a namespace in one round trip;
//   - RateBatcher: rates (GCRA) decided by the Redis server's clock
//     within batches of hits, and a Batch's RateDiffs;
//   - Slotter and SlotBatcher: concurrency slots (max_concurrent) as
//     leases that expire by the server's clock, also taken within batches;
//   - Banner: a namespace's bans and their version;
//   - Roster: the nodes attending a namespace (on_store_failure share);
//   - NearFeed: the keys that pushes or nodes' hits brought near a limit;
//   - Pinger: Ping, to every master on a Cluster;
//   - Parted: on a Cluster, Parts is 1024, one part per bucket (see
//     below), PartOf is a key's bucket, and PingParts pings once each
//     master that serves the given parts; a call that fails on some
//     masters only returns a *strategy.PartialError naming the failed
//     buckets, the rest of the call done. A standalone server or a
//     Sentinel-managed primary is one part, and its errors concern whole
//     calls.
//
// It is not a strategy.Maintainer: every key expires on its own, and no
// sweeper runs. GetWindow, outside the interfaces, reads one counter.
//
// # Errors
//
// Input that can never be stored is refused before anything is sent,
// with an error that wraps strategy.ErrRejected (ErrInvalidWindow for a
// bad window). Hits, batches of hits, slot acquisitions and rate
// decisions without an ID are sent at most once: never again after a
// network error, when a resend could count twice. Errors wrap
// strategy.ErrNotSent when the request surely never reached Redis (the
// dial failed, the pool timed out, the store is closed); any other error
// leaves the caller not knowing whether the call was applied. Pushes,
// resets, releases and renewals of slots, which go-redis may resend
// harmlessly (a push is guarded by its ID), wrap strategy.ErrNotSent only
// after Close.
//
// # Synchronous hits
//
// A Hit is one script run that applies Kong's order to every window of a
// key (up to 16): window by window, the hit is added to the current
// count, and the first window whose rate, current + previous × weight,
// exceeds its limit rejects it; the windows after it are only read. With
// undo, a rejected hit's increments are taken back within the same run,
// so no other client sees them. The store may send a previous window's
// count that an earlier reply gave instead of having the script read it:
// only a count read less than a second ago, and, unless the window's
// weight is 0, at least two seconds after that previous window ended.
// So a write that reaches a previous window more than two seconds after
// it ended is seen within a second. A Reset through the store forgets the
// counts it holds for the key.
//
// # Batches of synchronous hits
//
// HitBatch decides each hit as Hit would if the hits were sent one after
// the other, in one script run on a standalone server and one per Cluster
// slot that its keys fall in, pipelined in one round trip.
//
// Batch IDs make every increment count exactly once:
//
//   - A push (PushDiffs) applies a batch at most once per ID. A caller
//     retries a failed push under the same ID with the same diffs and
//     rates, in any order, and pushes new diffs in a batch of a new ID:
//     diffs added to a retried batch may be skipped or counted twice.
//   - A Hit with an ID and a Batch of that ID apply at most once between
//     them (the hit ID rule of strategy.Hitter), as long as the Batch
//     holds only the diffs of the hit's key.
//   - A HitBatch with an ID and a Batch of that ID apply at most once
//     between them, as long as the Batch that carries a failed script
//     run's hits holds at most one diff per window of each of those hits,
//     a RateDiff for each of them whose rate was admitted, and no diff of
//     any other hit. Fewer diffs never count twice; more may.
//
// The ID of a Hit or a HitBatch is remembered as long as its latest
// counter lives, within strategy.MinHitIDLife and strategy.MaxHitIDLife;
// a push's as long as the latest counter of each of its script runs, and
// at least strategy.MinBatchIDLife. A retry later than that, of a call
// that Redis applied although its reply was lost, counts twice, which
// errs towards limiting.
//
// # Cluster
//
// Every key of a (namespace, client key), its counters, rate state,
// slots and hit markers, is placed under the hash tag {<bucket>}, the
// bucket being a stable hash (FNV-1a) of the namespace and the key modulo
// 1024, so it lives in one slot and one script reaches it all; a
// namespace's bans, roster and near-limit marks are in the bucket of its
// empty key. The tag comes before anything a client controls, and
// key_prefix may not hold braces, so no client chooses a slot. A push, a
// fetch and a batch of hits send one script run or MGET per bucket
// touched, and go-redis pipelines them to the masters in parallel.
//
// A connection failure has the Cluster's slot map reloaded in the
// background, at most once every 200 ms; a call that failed then sends
// once more, to a master that took over the slots, what is safe to send
// twice (pushes, reads, bans, releases and renewals of slots, marks and
// attendance) or surely was not sent.
//
// go-redis's own log lines go to Caddy's logger, named redis, as
// warnings, at most one line per kind every 10 seconds.
package redis
