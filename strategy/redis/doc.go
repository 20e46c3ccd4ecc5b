// Package redis is the Redis storage strategy of the rate limiter: the Caddy
// module rate_limit.strategies.redis. It keeps the shared window counters of
// every node in one Redis deployment (a standalone server, a Sentinel-managed
// primary, or a Redis Cluster) through go-redis.
//
// # Settings and stores
//
// The module, Redis, is the settings (a strategy.Strategy): provisioning it
// replaces placeholders, applies defaults, checks the values and reads the
// TLS files, and holds nothing. StoreKey is every connection setting (and
// a digest of the TLS files), so that namespaces and configs naming the
// same Redis share one store. OpenStore returns the store, a copy of the
// settings with a go-redis client of its own, which dials only when first
// used; the rate_limit app closes it with Close, and the module's Cleanup
// leaves it alone. From Go, Open turns a filled-in Redis into a store
// itself, without Caddy. The store is a strategy.Hitter: it can serve
// synchronous namespaces.
//
// # Layout
//
// Every counter is one Redis string, holding a float, under the key
//
//	<prefix>:{<bucket>}:<size ms>:<window start ms>:<len(namespace)>:<namespace>:<client key>
//
// for example rl:{417}:60000:1700000040000:3:api:203.0.113.7. The parts:
//
//   - bucket is a stable hash of (namespace, client key) modulo 1024: FNV-1a
//     64 of the decimal length of the namespace, a colon, the namespace and
//     the client key, folded (h ^ h>>32) before the modulo. It is the same on
//     every node and in every process (unlike hash/maphash, which is seeded
//     per process), so all nodes agree on every key. The bucket count and the
//     hash are part of the storage format: changing either moves every
//     counter.
//   - {<bucket>} is a Redis Cluster hash tag, and it comes before anything a
//     client controls. Cluster hashes the text between the first '{' and the
//     first '}' after it; the prefix may hold neither, so the slot is always
//     chosen by our bucket, never by braces in a client key.
//   - The current and previous windows of one (namespace, key), of every
//     size, share the bucket and so the slot: the synchronous Hit script
//     touches those of every window of a limit at once, and a fetch reads
//     one bucket's counters with one MGET.
//   - A namespace's counters spread over 1024 hash tags, hence over many
//     cluster slots and every node, instead of one hot hash or slot per
//     namespace.
//   - The namespace is length-prefixed and the client key is the tail, so no
//     separator in either can make two counters share a key ("a:b" + "c"
//     and "a" + "b:c" differ in the length). Client keys are plain bytes: they
//     travel only as KEYS and ARGV of commands, never inside script text or
//     command names, so nothing a client sends is interpreted by Redis.
//
// Values are added with INCRBYFLOAT, so fractional hits work, and every
// counter expires on its own: each write sets PEXPIREAT to the window start
// plus twice the window size plus one second, the last moment the counter
// can be a previous window. No sweeper is needed and no key outlives its use.
//
// # Pushing diffs
//
// PushDiffs groups a batch's diffs by bucket and sends, for each group, one
// EVALSHA of a Lua script whose first key is a dedupe marker in the same
// slot, <prefix>:{<bucket>}:push:<n>:<batch ID> (n numbers the groups of
// one bucket, when a batch holds more than 256 diffs of one bucket). The script sets the marker
// with SET NX PX and applies the group's INCRBYFLOAT and PEXPIREAT only if
// that succeeded, so a batch pushed again with the same ID (a retry after a
// timeout, whose first attempt may have been applied with its reply lost)
// is never counted twice. The marker outlives every counter it covers. The
// groups are pipelined: a batch of up to 1,000 diffs costs one round trip
// (go-redis splits a pipeline per Cluster node and sends the parts in
// parallel), and larger batches go in several bounded pipelines. The number
// of commands grows with the number of buckets touched, never with the
// number of hits behind the diffs.
//
// A retry must carry the same diffs, in any order: the groups, and so what
// each marker covers, depend only on the set of diffs. Diffs merged into a
// failed batch under a new ID would count again whatever the failed attempt
// applied, so a caller retries a failed batch as it was, under its ID,
// and pushes new diffs in a batch of their own.
//
// A synchronous hit with an ID sets a marker too (see Synchronous hits):
// the one, <prefix>:{<bucket>}:push:0:<ID>, that a batch of that ID holding
// only the diffs of the hit's key sets, as such a batch is one bucket and
// one group. So the batch that carries a failed hit's diffs is skipped if
// the hit was applied, and applied if it was not. It must hold that key's
// diffs alone: diffs of other keys of the bucket would be skipped with
// them.
//
// # Fetching counters
//
// Kong's get_counters downloads every counter of a namespace on every sync,
// which costs in proportion to all the keys every node has ever seen in the
// window, and needs a scan of the keyspace. Here a node fetches only the
// keys it saw since its last sync: a store count matters to a node only for
// keys it is being hit with, and those are the keys most likely to be hit
// again before the next sync. (A key new to a node counts locally until the
// sync after its first hit, one sync interval later.) GetCounters reads, for
// each such key and window size, the current and previous windows, with one
// MGET per bucket (keys of one bucket share a slot, so MGET works on
// Cluster), pipelined: one round trip per 4,096 counters. The cost is proportional to
// len(keys)*len(sizes), never to the size of the namespace, and no SCAN or
// KEYS is ever issued. Counters the store does not hold are omitted, so a
// store that lost its data does not erase what a node knows.
//
// # Resetting a key
//
// Reset writes "0" to the current and previous counters of each window size
// of one (namespace, key), each with the PEXPIREAT of any write of that
// window, so that every node's next fetch of the key reads zeros and takes
// the reset, and diffs pushed afterwards add to zero. The counters share the
// key's bucket, hence one slot, so one MULTI/EXEC carries every SET and
// PEXPIREAT: one round trip, atomic, on a Cluster too. Dedupe markers are
// left as they are: a batch pushed before the reset stays applied once.
//
// # Synchronous hits
//
// Hit applies one hit to every window of a key's limits (up to 16) and
// decides it with one Lua script run: one round trip per hit, whatever the
// number of windows. The script follows Kong's order: window by window, in
// the order given (ascending size), it adds the hit to the current counter
// (INCRBYFLOAT, then PEXPIREAT as above) and reads the previous one, and
// the first window whose rate, current + previous * weight, exceeds its
// limit rejects the hit; the windows after it are only read, not
// incremented. With undo (disable_penalty), the script takes the rejected
// hit's increments back before it ends, so no other node ever sees them.
// An infinite limit travels as an empty string, since Lua 5.1 does not
// parse "inf" reliably. The script replies with strings, since Redis
// truncates Lua numbers to integers. It is sent with EVALSHA, and with EVAL
// once per server when the server does not hold it (a new or restarted
// server).
//
// A hit is never resent after a network error: go-redis would resend a
// command whose reply was lost (a read timeout, a reset), and a hit applied
// twice counts twice. Its errors wrap strategy.ErrNotSent when the hit
// surely never reached Redis (dialing failed, the pool timed out, the
// client is closed), so that the caller can count it locally instead.
//
// Any other failure leaves the caller not knowing whether the hit was
// applied: it timed out after it was sent, and Redis may run it later.
// For that case a hit may carry an ID, which the caller gives every hit
// (the sync app does), under the hit ID rule of strategy.Hitter. The script then starts with SET NX PX of the hit's
// marker, <prefix>:{<bucket>}:push:0:<ID>, in the slot of the hit's
// counters, and applies the hit only if the marker was not there. A caller
// whose hit failed counts it locally and pushes its diffs later as a batch
// of the hit's ID, which sets and checks the same marker (see Pushing
// diffs): the hit counts once, whether Redis ran it, runs it after the
// batch, or never saw it. A hit whose marker is already there (the same ID
// sent twice, or its batch pushed first) increments nothing and undoes
// nothing: it returns the counts as they are and the decision Kong's order
// takes on them, as a hit whose every value is 0 would.
//
// The marker lives as long as the latest of the hit's counters, but at
// least one minute and at most two: a caller retries a failed hit as soon
// as Redis answers again, well within that. (For counters that live longer
// than two minutes, that is shorter than the hit ID rule asks, on purpose.) That costs one small key,
// holding "1", per synchronous hit with an ID (about 150 bytes of Redis
// memory with its expiry), and one more SET inside the script: a store
// taking h such hits a second holds at most 120h markers, about 18 MB at
// 1,000 hits a second. A retry later than the marker's life, of a hit that
// Redis applied although its reply was lost, would count it twice, which
// errs towards limiting. A hit without an ID sets no marker.
//
// # Windows and values
//
// Window sizes must be whole milliseconds, as keys hold sizes and starts in
// milliseconds; other sizes are refused with an error that wraps
// ErrInvalidWindow. Diffs with a zero, NaN or infinite value are dropped,
// and diffs of windows that have already expired (start + 2*size <= now)
// are skipped.
package redis
