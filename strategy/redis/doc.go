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
// same Redis share one store. OpenStore returns the store, a Store built
// from the checked settings with a go-redis client of its own, which dials
// only when first used; the rate_limit app closes it with Close. From Go,
// Open does what Provision does and opens a Store, without Caddy. The
// store is a strategy.Hitter, so it can serve synchronous namespaces, a
// strategy.Slotter, so it can hold the concurrency slots of max_concurrent
// for a fleet, a strategy.Banner, so its bans reach every node, and a
// strategy.NearFeed, so every node learns which keys came near a limit.
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
// Values are floats, so fractional hits work, and every counter expires on
// its own, at the window start plus twice the window size plus one second,
// the last moment the counter can be a previous window. That expiry depends
// only on the window, so it is set once, by the command that makes the
// counter (SET ... PXAT, which writes the value and the expiry together),
// and the writes that follow keep it (INCRBYFLOAT keeps a key's expiry).
// No sweeper is needed and no key outlives its use.
//
// # Pushing diffs
//
// PushDiffs sorts a batch's diffs (and its rates' turns) by bucket and
// cuts them into runs of at most 256 counters, each pushed by one EVALSHA
// of a Lua script whose first key is the run's dedupe marker,
// <prefix>:{<bucket>}:push:<n>:<batch ID>. On a Cluster, a script may only
// touch one slot, so a run holds the diffs of one bucket, and its marker
// is group n of that bucket, n numbering the runs of the bucket (several
// when a batch holds more than 256 diffs of one bucket): at most
// ceil(d/256) runs in a bucket that holds d of the batch's diffs. A
// standalone server (or a Sentinel-managed primary) has no slots: the
// bucket-sorted diffs are cut every 256 whatever their buckets, so a run
// may hold the diffs of several buckets, and a batch of 1,000 new keys is
// four runs where a Cluster needs one per bucket touched (about 700); run
// n's marker is the batch's group n, in bucket 0: at most ceil(d/256)
// groups for a batch of d diffs. The markers of a batch of synchronous
// hits rely on those bounds (see Batches of synchronous hits).
//
// The script sets the marker with SET NX PX and applies the run only if
// that succeeded, so a batch pushed again with the same ID (a retry after a
// timeout, whose first attempt may have been applied with its reply lost)
// is never counted twice. The marker outlives every counter it covers. It
// then reads the run's counters with one MGET, and makes each new counter
// with SET ... PXAT ... NX (value and expiry, one command) or adds to an
// existing one with INCRBYFLOAT (one command, the expiry kept). A run of
// one counter skips the MGET and tries the SET NX first, which is never
// dearer. So a run of k counters costs k + 3 commands (the EVALSHA, its
// marker, its MGET), and a diff about one. The runs are pipelined: a batch
// of up to 1,024 diffs costs one round trip (go-redis splits a pipeline per
// Cluster node and sends the parts in parallel), and larger batches go in
// several bounded pipelines. The number of commands grows with the number
// of counters changed (and, on a Cluster, of buckets touched), never with
// the number of hits behind the diffs.
//
// A retry must carry the same diffs, in any order: the runs, and so what
// each marker covers, depend only on the set of diffs (a bucket that a cut
// splits is sorted by key, window and value first), and diffs of windows
// that ended by the time of a retry are left out of their run after the
// cut, not before it. Diffs merged into a failed batch under a new ID would
// count again whatever the failed attempt applied, so a caller retries a
// failed batch as it was, under its ID, and pushes new diffs in a batch of
// their own.
//
// A synchronous hit with an ID sets a marker too (see Synchronous hits):
// the one, <prefix>:{<bucket>}:push:0:<ID>, that a batch of that ID holding
// only the diffs of the hit's key sets, as such a batch is one run (run 0,
// starting in the key's bucket) on a standalone server and on a Cluster
// alike. So the batch that carries a failed hit's diffs is skipped if the
// hit was applied, and applied if it was not. It must hold that key's
// diffs alone: diffs of other keys would be skipped with them, or, on a
// standalone server, change the run's marker.
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
// each such key and window size, the current and previous windows, with
// MGETs of up to 512 counters, pipelined: one round trip per 4,096
// counters. On a standalone server an MGET reads counters of any buckets,
// so 256 keys of one window size cost one command; on a Cluster an MGET
// keeps to one slot, so it reads one bucket's counters and a fetch costs
// one MGET per bucket touched. The cost is proportional to
// len(keys)*len(sizes), never to the size of the namespace, and no SCAN or
// KEYS is ever issued. Counters the store does not hold are omitted, so a
// store that lost its data does not erase what a node knows.
//
// # Resetting a key
//
// Reset writes "0" to the current and previous counters of each window size
// of one (namespace, key), each with SET ... PXAT and the expiry of any
// write of that window, so that every node's next fetch of the key reads
// zeros and takes the reset, and diffs pushed afterwards add to zero. The
// counters share the key's bucket, hence one slot, so one MULTI/EXEC
// carries every SET: one round trip, atomic, on a Cluster too. Dedupe
// markers are left as they are: a batch pushed before the reset stays
// applied once.
//
// # Synchronous hits
//
// Hit applies one hit to every window of a key's limits (up to 16) and
// decides it with one Lua script run: one round trip per hit, whatever the
// number of windows. It follows Kong's order: window by window, in the
// order given (ascending size), it adds the hit to the current counter,
// and the first window whose rate, current + previous * weight, exceeds
// its limit rejects the hit; the windows after it are only read, not
// incremented. The rate is decided on the count INCRBYFLOAT returns, as
// stored. An infinite limit travels as an empty string, since Lua 5.1 does
// not parse "inf" reliably. The script replies with strings, since Redis
// truncates Lua numbers to integers. It is sent with EVALSHA, and with
// EVAL once per server when the server does not hold it (a new or
// restarted server).
//
// The script writes the current counters in one of two ways, which the
// store chooses per hit:
//
//   - Incrementing first, when the store sends every window's previous
//     count (see Remembered previous counts): INCRBYFLOAT adds to the
//     counter, keeps its expiry and returns the count to decide on. A
//     counter that INCRBYFLOAT made (its count is then the increment) gets
//     its expiry with PEXPIREAT in the same run; one that held 0 gets the
//     same expiry again. The script reads nothing, unless a window rejects
//     the hit: the current counts of the windows after it are then read
//     with one MGET.
//   - Reading first, otherwise: one MGET reads the current counters and
//     the previous ones not sent, and each current counter is written with
//     one command, SET ... PXAT ... NX for a new one (the value and its
//     expiry) or INCRBYFLOAT for one that exists. A previous count to read
//     costs the MGET anyway, and this way a new counter costs one write,
//     not two.
//
// With undo (disable_penalty), a hit that reads first is decided in doubles
// on the counts read: one surely rejected writes no counter at all. One
// that is admitted, or whose rate is too close to its limit for doubles to
// tell, is applied as above, and if it is rejected after all the script
// takes its increments back before it ends, so no other node ever sees
// them. The store has a hit with undo read first, too, when the counts of
// the key's last reply reject it: a key at its limit whose clients keep
// trying then costs a read per try, not an increment and its undo.
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
// (the sync app does), under the hit ID rule of strategy.Hitter. The
// script then first sets the hit's marker, <prefix>:{<bucket>}:push:0:<ID>,
// in the slot of the hit's counters, with SET NX PX, which checks and
// records it in one command: the hit is applied only if that made the
// marker, which stays even when the hit is rejected and undone, so that
// its batch is then skipped. A caller
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
// than two minutes, that is shorter than the hit ID rule asks, on purpose.)
// That costs one small key, holding "1", per synchronous hit with an ID
// (about 150 bytes of Redis memory with its expiry), and one more SET
// inside the script: a store taking h such hits a second holds at most
// 120h markers, about 18 MB at 1,000 hits a second. A retry later than the
// marker's life, of a hit that Redis applied although its reply was lost,
// would count it twice, which errs towards limiting. A hit without an ID
// sets no marker.
//
// # Batches of synchronous hits
//
// HitBatch applies several synchronous hits of a namespace, in the order
// given, each deciding as Hit would if they were sent one after the
// other, with one script run for the whole batch on a standalone server
// (or a Sentinel-managed primary), and one per slot its keys fall in on a
// Cluster, pipelined: go-redis sends one pipeline per node, in parallel,
// so a batch costs one round trip. The script reads every counter of its
// hits once, with one MGET (less the previous counts the store remembers
// and sends, as for Hit), decides the hits in Lua on running counts, and
// writes each counter that changed once, at the end: SET ... PXAT ... NX
// for a new one, SET ... KEEPTTL of its count for one that exists and
// stays whole (a SET costs Redis a fifth of an INCRBYFLOAT), INCRBYFLOAT
// of the sum of its increments for any other. So the hits of one key in a
// batch cost one read and one write
// per window, not per hit: a batch of n hits of one key with two windows
// costs five commands, whatever n. Each hit follows Kong's order; a
// rejected hit with undo has its increments taken back at once, restoring
// exactly the counts it found; a counter that one hit writes and a later
// one reads as its previous window's is one running count. Rates are
// decided in doubles on those running counts, where a Hit decides on the
// count INCRBYFLOAT stores: the two agree exactly for counts that doubles
// hold exactly (binary fractions, such as whole or half costs); otherwise
// a count may differ by a rounding in its last digit, and a rate within
// such a rounding of its limit be decided the other way. What Redis
// spends on a batch is mostly its arguments and Lua's tonumber, so the
// batch is sent in few of them: the limits once for all the keys that
// share them, the counters, the forms (a key's windows as its hits send
// them) and the hits packed in 16-bit fields of three arguments, the
// weights in one, and no key for a previous count the store sends. Most
// batches are far from their limits: when every increment is whole, no
// hit has a rate, and each current counter is in one window of the
// batch's forms, the script adds each form's hits to its current
// counters with INCRBY (one command per counter, read and write, which
// keeps the expiry), and if every window stays under its limit at the
// counts INCRBY replies (with the greatest weight any hit gives the
// previous count), every hit is admitted at once, without deciding them
// one by one; otherwise the increments are taken back and the hits are
// decided one by one as above. The script replies each count before the
// hits and, unless it admitted them all at once, each hit's rejecting
// window, from which the store computes every hit's counts in the
// script's order and doubles. A batch of one hit is sent as a Hit. A script run is sent at most once, as a hit is; a
// run that fails fails its hits (every hit on a standalone server, those
// of its slot on a Cluster), each with an error that wraps
// strategy.ErrNotSent if the run surely never reached Redis. A batch is
// one script: the caller keeps batches to a size that Redis runs in a
// moment (a few hundred hits).
//
// A batch with an ID follows the hit ID rule, with markers whose names a
// Batch of that ID (see Pushing diffs) checks. On a Cluster each script
// run has, for every bucket k of its hits, the markers of groups 0 to
// ceil(w/256)-1 of bucket k under the ID, w being the number of windows
// of the run's hits of bucket k (a hit's rate counting as one window
// more); on a standalone server, the batch's groups 0 to ceil(w/256)-1, w
// being the windows of all its hits: one marker for up to 128 hits of two
// windows, however many keys they have, where a marker per key cost Redis
// a third of a batch of many keys. Group 0 is the marker a Hit of that ID
// sets. A run checks its markers first (SET NX for a single marker, one
// EXISTS for several): if none exists, it sets them and applies its hits;
// if any exists, it sets none and only reads, deciding every hit on the
// counts as they are. The markers live as a hit's do.
//
// The rule that makes a batch and its Batch count once between them:
// a caller whose script run failed (it may have been applied) pushes the
// increments of the run's hits as one Batch of the batch's ID, with at
// most one diff per window of each hit (a diff per counter, or fewer, is
// fine), a rate's turn for each hit with a rate, and no diff of any
// other hit. On a Cluster that Batch then holds at most w diffs of bucket
// k, so at most ceil(w/256) of its runs are in bucket k: each marker that
// the Batch checks is group n < ceil(w/256) of a bucket of the failed
// run's hits, one that the run sets, also when the diffs of one bucket
// spill past one group of 256. On a standalone server it holds at most w
// diffs in all, so its runs are groups n < ceil(w/256) of the batch, all
// set by the run. So:
//
//   - if the script run was applied first, it set every marker the Batch
//     checks, and the Batch applies nothing;
//   - if the Batch was applied first, in full or in part, the run finds
//     at least one of its markers and applies nothing: every hit counts
//     through the Batch, whose retries, under the same ID, apply the part
//     that failed;
//   - if the run never reaches Redis, the Batch applies every diff.
//
// Either way each hit counts once. The same holds run by run on a
// Cluster, where each slot's run has markers of its own buckets only. A
// Batch that held more diffs of a bucket (several diffs per window, or
// another hit's) could check a marker the run did not set and count twice;
// one that held fewer is always fine.
//
// # Remembered previous counts
//
// A previous window's count hardly changes once the window has ended. So
// the store remembers, for each window of a key it hit recently, the
// previous count and the current count that the last reply gave, and sends
// the previous count with the key's next hits, which then do not read it.
// A count is sent only
//
//   - if it was read at least two seconds after the previous window ended
//     (by this node's clock), when every synchronous hit of that window
//     has reached Redis: a hit reaches it within its timeout (a second in
//     the sync app) of the moment its node chose the window, and nodes'
//     clocks may differ by up to a second (the layout's expiry margin). A
//     window of weight 0 (a fixed window) does not use its previous count
//     in its decision, so its count is sent even if it was read sooner:
//     only the previous count in the reply may then lack a hit that came
//     late;
//   - and for a second after it was read. What reaches a previous window
//     later than those two seconds (a failed hit, pushed as a batch once
//     Redis answers again; the diffs of a node that syncs less often; a
//     reset through another node) reaches this node's hits at most a
//     second later than a read would have seen it. A key that this node
//     hits more than once a second reads its previous count about once a
//     second.
//
// So a hit is decided on the counts its script would have read, unless a
// write reached the previous window more than two seconds after it ended,
// and then the hit sees it within a second: at sync_rate 0 a fleet still
// admits exactly the limit. A reset through this store forgets what
// it remembered of the key. A sliding window of two seconds or less never
// has a previous count to send, and reads it on every hit.
//
// Client keys are chosen by clients, so the memory is bounded: 16 shards
// (by bucket), each of two generations of at most 1,024 windows, a new
// generation started (and the older one dropped) when the current one is
// full or a second old. That is at most 32,768 windows, a few megabytes; a
// window pushed out early only has its previous count read again. Each
// store has its own, so the configs that share a store share it too.
//
// # Bans
//
// The store is a strategy.Banner: it holds the bans of a namespace, for a
// fleet, in a sorted set and a string under the keys
//
//	<prefix>:{<bucket>}:bans:<len(namespace)>:<namespace>
//	<prefix>:{<bucket>}:bansv:<len(namespace)>:<namespace>
//
// in the bucket of the namespace's empty key, so one script reaches both
// on a Cluster. A member of the set is a banned key, its score the ban's
// end in Unix milliseconds; the string is the bans' version, the server's
// time in microseconds at the last change (or one more than the last
// version). SetBans is one script run: it drops the bans that ended,
// keeps the later of two ends (ZSCORE, ZADD), lifts with ZREM, sets a new
// version when anything changed, and has the set expire a second after
// its last ban ends, the string a second after the latest end of a ban it
// held or lifted: a lift keeps the version, so that version 0 with a ban
// in force tells a node that Redis lost its bans. GetBans is one script
// run that returns the version alone when the caller knows it (a GET),
// and otherwise every ban that has not ended (ZRANGEBYSCORE).
//
// The store is a strategy.Roster: the nodes of a namespace whose
// on_store_failure is share attend it in a sorted set
//
//	<prefix>:{<bucket>}:fleet:<len(namespace)>:<namespace>
//
// in the bucket of the namespace's empty key: member a node's ID, score
// when its attendance expires, in Unix milliseconds by Redis's clock.
// Attend is one script run: ZREMRANGEBYSCORE of the expired members,
// ZADD of the node, PEXPIREAT of the set with its latest member, ZCARD.
//
// # Keys near their limits
//
// The store is a strategy.NearFeed: a push whose batch has a Near marks
// the keys whose counts it brings near their limits, for every node to
// read with its next fetch. A namespace's marks are a stream and a string:
//
//	<prefix>:{<bucket>}:near:<len(namespace)>:<namespace>
//	<prefix>:{<bucket>}:nearv:<len(namespace)>:<namespace>
//
// in the bucket of the namespace's empty key, as its bans. The string
// holds "<version> <end> <streamed>" and the newest marks: the version
// counts the marks, from the server's time in microseconds when the feed
// was made; the latest end of a mark is when the string expires (PXAT),
// so that a namespace whose marks all ended holds nothing and reads as
// version 0; streamed is the version of the newest mark in the stream.
// The marks after it follow, each " <end> <length of the key> <key>"
// (the key any bytes, its end in Unix milliseconds), up to 512 bytes of
// them: the push that would pass that moves them all to the stream, in
// entries of up to 256 marks, each a field (the key) and a value (its
// end), whose ID is "<version of its last mark>-0"; each XADD drops the
// entries that hold only marks older than the newest 65,536 (MINID,
// exact), and the stream expires (PEXPIREAT) with the latest end. A push
// run that may mark sends each counter's threshold and mark's end, and
// decides on the new count that its INCRBYFLOAT replies (or that SET NX
// made): on a standalone server it writes its marks itself, the string
// read by the run's MGET (a run of one counter GETs it); on a Cluster
// its runs reply with the counters that marked and the push writes them
// with one more script run in the feed's slot. GetCountersNear reads the
// string with GetCounters' MGETs: a reader up to date, or behind by no
// more marks than the string holds, takes them from there; only one
// further behind reads the older ones (XRANGE from the entry after the
// version known, up to streamed), in a second round trip.
//
// # Concurrency slots
//
// The store is a strategy.Slotter: it holds the slots of max_concurrent
// across a fleet. The slots of one (namespace, client key) are one sorted
// set, under the key
//
//	<prefix>:{<bucket>}:slots:<len(namespace)>:<namespace>:<client key>
//
// in the bucket of the key's counters, hence in their Cluster slot (and
// never read as a counter: "slots" is not a size). A member is a slot's
// ID, which the caller makes unique per request (the node's ID and a
// sequence number); its score is when the slot expires, in Unix
// microseconds by the Redis server's clock (TIME, read inside the
// scripts), so that the nodes' clocks play no part. The set expires on
// its own with its latest slot: each write that extends a slot past the
// set's time to live extends that too (PEXPIRE, to the lease plus a
// millisecond). So a set nobody touches vanishes once its slots have
// expired, and an acquisition drops the expired members of a set in use.
//
// AcquireSlot is one EVALSHA of a script (EVAL once per server when the
// server lacks it), sent at most once, as a hit is: TIME, ZREMRANGEBYSCORE
// of the expired slots, ZCARD, then, if fewer than max are held, ZADD of
// the slot (which renews an ID that is held) and PTTL, with PEXPIRE when
// the set's life must grow; a key that is full costs a ZSCORE instead, to
// see whether the ID is one of its slots (a held ID is renewed, whatever
// the count). The script is atomic, so concurrent acquisitions of one key
// take turns, on a Cluster too. Its errors wrap strategy.ErrNotSent when
// it surely never reached Redis; after any other error the slot may have
// been taken: acquiring the ID again renews it, releasing it frees it, and
// otherwise its lease frees it.
//
// ReleaseSlots is one ZREM per key of the slots given (with all its IDs),
// and RenewSlots one EVALSHA per key of a script that reads each slot's
// score (ZSCORE) and extends with ZADD XX those that have not expired,
// then the set's life as an acquisition does; each call is one pipeline,
// so one round trip (one per node on a Cluster, in parallel) for up to
// 1,024 keys. Both are idempotent, and go-redis resends them after a
// network error; their errors wrap strategy.ErrNotSent only on a closed
// store.
//
// # Rates
//
// The store is a strategy.Rater: it decides the rates (GCRA) of
// synchronous namespaces by the Redis server's clock. A key's TAT under
// the rates of one window is one string, in Unix microseconds, under
//
//	<prefix>:{<bucket>}:rate:<window ms>:<len(namespace)>:<namespace>:<client key>
//
// and the record of a request's ID (a turn taken, refused or given back)
// one string under
//
//	<prefix>:{<bucket>}:rateid:<len(namespace)>:<namespace>:<id>
//
// both in the bucket, and so the Cluster slot, of the key's counters;
// "rate" and "rateid" are no number, "push", "slots" or "bans", so they
// never read as another kind of key. The TAT expires once it has passed,
// the record after strategy.RateIDLife. See gcra.go for the scripts.
//
// # Cluster failover
//
// go-redis routes a Cluster's commands by its map of slots to masters,
// which it reloads when a node answers MOVED or ASK and otherwise once a
// minute. A master that dies answers nothing, so without more, go-redis
// sends its slots to its address until the next periodic reload, even
// after its replica was promoted: measured, every pipeline holding one
// of those slots failed for a minute, so every push and fetch of a
// namespace (whose counters spread over every master) failed, and hits
// of the dead master's keys.
//
// So the store watches its node clients (a hook on each): a connection
// failure (a refused or timed-out dial, an EOF, a reset, an i/o timeout)
// has the map reloaded in the background, at most once per 200 ms (one
// CLUSTER SLOTS, so a node that stays down costs at most five a second
// per store). go-redis tries a pipeline's failed commands again, up to
// three times, each time on the node the map gives them when the attempt
// before failed, so a reload that ends meanwhile reroutes them. A call
// that fails all the same waits for the reload in flight, or runs one
// unless one started less than 200 ms ago, and then sends once more the
// commands whose slot the map now gives to a master that did not fail
// during the call, such as the promoted replica; commands whose slot
// still belongs to a node that failed are not tried again. That is safe:
// a push's runs are guarded by their markers, reads change nothing,
// setting bans and renewing slots twice is harmless, and a hit or a slot
// acquisition is sent again only if its first attempt surely was not sent
// (a refused dial); releasing a slot twice frees it once. Resets and
// GetWindow rely on the reload and go-redis's own retries alone. Within one pipeline, the
// commands for the healthy masters are applied at the first attempt,
// whatever happens to the others, but the call still fails while a
// master of its slots is down and not yet replaced. Measured
// (TestClusterFailover, a master killed and its replica promoted, each
// operation through a store of its own): the first push after the
// promotion, mixing keys of every master, succeeded about 0.5 s after
// it, and the first fetch and hits too (each taking under 0.5 s); it
// took 60 s before.
//
// go-redis's own log lines (such as failed dials of its pools) go to
// Caddy's logger, named redis, as warnings, at most one line per kind
// every 10 s, with the number held back; go-redis's logger is one per
// process, set when the first store opens.
//
// # Commands per call
//
// What Redis runs, as INFO commandstats counts it (the EVALSHA and every
// command its script runs), in steady state; commands_test.go holds these
// numbers.
//
//   - A synchronous hit of one window with an ID (what the sync app
//     sends), of a key this node hit before in the window, its previous
//     count remembered: 3 commands, the EVALSHA, the SET NX of the marker
//     and the INCRBYFLOAT of the counter, where the script before ran 4
//     (an MGET read the counters and the marker, and the marker's SET
//     followed). Without an ID, 2. Each further window adds its
//     INCRBYFLOAT (3 windows with an ID: 5, where it ran 6).
//   - A synchronous hit that reads first adds an MGET: 4 commands for one
//     window with an ID (a new counter's write is then its SET NX PXAT),
//     6 for three. That is a key new to the node; the first hit of a
//     window, or the first in the two seconds after a sliding window
//     starts; a previous count read again after a second; and every hit
//     of a sliding window of two seconds or less. A counter that an
//     incrementing hit makes (only when this node remembered a previous
//     count but the counter was not there, as after an undone hit) adds
//     its PEXPIREAT.
//   - A synchronous hit whose ID was applied already: 3, the EVALSHA, the
//     SET NX that fails and the MGET. A rejected hit with the penalty
//     costs what an admitted one does; with undo, one that the key's last
//     reply foresaw costs 3 with an ID (the MGET instead of the
//     INCRBYFLOAT) and 2 without, one that it did not, 4 (the INCRBYFLOAT
//     and its undo).
//   - A batch of synchronous hits (HitBatch), per script run: the
//     EVALSHA, the markers (one SET NX for one marker; an EXISTS and a
//     SET per marker for several: one per bucket of the run's hits, and
//     one more per 256 windows of a bucket), one MGET, and one write per
//     counter its hits changed (SET NX PXAT new, INCRBYFLOAT existing).
//     A batch of n hits of one key with two windows, with an ID: 5
//     commands whatever n (0.5 a hit at 10 hits, 0.05 at 100); 13 at
//     1,000 hits (eight markers and the EXISTS). 100 hits of 100 keys:
//     303, about three a hit where one by one they cost four each, in
//     one round trip instead of 100. A batch of one hit costs what Hit
//     does.
//   - A periodic push, standalone: about one command per diff, new counter
//     (SET NX) or not (INCRBYFLOAT), plus 3 per run of 256 diffs. A new key
//     hit once, pushed and then fetched, costs about 1.02 commands: a
//     thousand such keys cost 4 EVALSHA, 4 marker SETs, 4 MGETs and 1,000
//     SETs to push, and 4 MGETs per fetch.
//   - On a Cluster, a run and an MGET keep to one bucket: each bucket a
//     push touches costs its EVALSHA and its marker (and its MGET if the
//     run has several counters), and each bucket a fetch touches one MGET.
//     A thousand new keys (about 700 buckets) cost about 3.3 commands a
//     key to push and fetch once.
//   - Near-limit marks (a batch with a Near): a run that marks nothing
//     costs what it costs without; a run that marks costs the SET of the
//     version's string (a run of one counter one GET more), TIME when the
//     feed is new, and, when the string's marks pass 512 bytes, one XADD
//     per 256 of them and a PEXPIREAT. On a Cluster a push that marks
//     costs one more script run, one round trip: EVALSHA, GET and SET. A
//     fetch costs what GetCounters does on a standalone server (the MGET
//     reads the string), at most one MGET more on a Cluster, and one MGET
//     with no keys; one further behind than the string's marks adds an
//     XRANGE, in one more round trip.
//   - A reset: MULTI, one SET per counter (two per window size), EXEC.
//   - A slot taken: 7 commands, EVALSHA, TIME, ZREMRANGEBYSCORE, ZCARD,
//     ZADD, PTTL and PEXPIRE (which a slot taken in the same millisecond
//     as the key's previous one skips). A slot refused as the key is full:
//     5, EVALSHA, TIME, ZREMRANGEBYSCORE, ZCARD and ZSCORE.
//   - A release: one ZREM per key, whatever its number of slots. A
//     renewal: per key, EVALSHA, TIME, PTTL, PEXPIRE, and a ZSCORE and a
//     ZADD per slot (one request renewing its one slot: 6).
//
// Three commands for a synchronous hit with an ID leave two inside the
// script, and the hit must write two keys: its marker and its counter.
// Redis 7.0 has no command that writes several keys and keeps or sets
// their expiries (MSET and MSETNX drop them), and holding the markers in
// the counter (a hash of its count and its hits' markers) would make every
// new counter a push makes cost two commands (SET ... PXAT makes strings
// only), every fetch a command per counter (there is no multi-key HMGET),
// and keep the markers as long as their window without per-field expiry
// (HEXPIRE, Redis 7.4). So the layout stays strings, and the script saves
// its reads instead: SET NX checks and writes the marker at once,
// INCRBYFLOAT returns the count it made, and the previous count, the one
// read left, comes from the store's memory (see Remembered previous
// counts), which the previous window's end makes safe to keep. No command
// reads another key while it writes one (SET ... GET returns the key's own
// value), so a read of the previous counter would be a third command in
// the script.
//
// Fewer commands do not make a hit much cheaper for Redis, though: the
// EVALSHA's own cost (the script's call, its KEYS and ARGV, its reply)
// dominates, and a hit of one window takes about as long in Redis with
// three commands as with four or five (in INFO commandstats, alternating
// runs of 20,000 hits gave 19-23µs per EVALSHA either way on a loaded test
// machine, where an idle one gave some 8µs). A script that decided every
// hit in Lua before writing the sums with SET cost Redis a fifth more; so
// the script adds with INCRBYFLOAT and decides on its result, and decides
// in Lua only the rejections of undo that read first, which then write
// nothing. Pushes gain the most from fewer commands: a standalone server
// runs a push of 1,000 counters in four script runs instead of one per
// bucket touched, in a fifth of the time.
//
// The layout (key names, values, expiries, markers) is the same as before
// the commands were trimmed: only the number of commands changed, and
// nodes running any of these versions can share a store.
//
// # Windows and values
//
// Window sizes must be whole milliseconds, as keys hold sizes and starts in
// milliseconds; other sizes are refused with an error that wraps
// ErrInvalidWindow. Diffs with a zero, NaN or infinite value are dropped,
// and diffs of windows that have already expired (start + 2*size <= now)
// are skipped.
package redis
