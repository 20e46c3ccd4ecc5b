// Package postgres is the PostgreSQL storage strategy of the rate limiter:
// the Caddy module rate_limit.strategies.postgres. It keeps the shared
// window counters of every node in one table of a PostgreSQL database
// (version 13 or later), through a pgx connection pool.
//
// # Configuration
//
//	strategy postgres {
//		dsn postgres://rl:secret@db.internal:5432/ratelimit?sslmode=verify-full
//		table rate_limit_counters
//		max_conns 10
//	}
//
// The DSN is a URL or keyword/value pairs, as libpq and pgx take them,
// and may be a placeholder such as {env.DATABASE_URL}. TLS is chosen by
// sslmode (and sslrootcert, sslcert, sslkey): pgx does it. A DSN that does
// not parse is refused when the config loads, with an error that shows the
// DSN with its password replaced by xxxxx. Loading, validating or opening
// a store never connects: the pool is made, and the first connection
// opened, by the store's first call.
//
// # Schema
//
// On its first call a store creates, when they are missing, in one
// transaction that holds an advisory lock, so that nodes starting together
// take turns (and a unique violation from one that does not lock means the
// objects are there: it tries again):
//
//	<table> (namespace bytea, key bytea, size_ms bigint, start_ms bigint,
//	         value double precision, expires_at bigint,
//	         PRIMARY KEY (namespace, key, size_ms, start_ms))
//	<table>_exp ON <table> (expires_at)
//	<table>_ids (namespace bytea, id bytea, expires_at bigint,
//	             PRIMARY KEY (namespace, id))
//	<table>_ids_exp ON <table>_ids (expires_at)
//
// and the first synchronous hit creates FUNCTION <table>_hits(...) (see
// Batches of synchronous hits) the same way, apart,
// so that a role that may not create objects keeps its counters when it
// upgrades. A function whose body is not this version's is replaced,
// which needs the right to; a role without it uses the function a DBA
// made, as it is.
//
// Sizes and starts are in milliseconds, so window sizes must be whole
// milliseconds; expires_at is in Unix milliseconds. Namespaces, keys and
// IDs are bytea: any bytes, with no encoding to get wrong, and they only
// ever travel as bound parameters. One longer than a B-tree entry may be
// (a namespace or an ID of over 256 bytes, a key of over 1,024) is stored
// as its first bytes followed by its SHA-256, which keeps it distinct. The
// table name is a plain identifier, optionally schema-qualified, quoted
// wherever it is used. Should someone drop the objects, the call that
// finds them missing fails and the next creates them again.
//
// # Pushing diffs
//
// PushDiffs is one statement, so one round trip (plus, the first time on
// each pooled connection, one to prepare it), whatever the number of
// diffs: a CTE inserts the batch's ID into <table>_ids with ON CONFLICT DO
// NOTHING, and only if that inserted a row does the upsert of the diffs,
// from unnest() of four arrays, add them to their counters (INSERT ... ON
// CONFLICT DO UPDATE SET value = value + excluded.value). The statement is
// atomic, so a batch pushed again under its ID (a retry after a timeout,
// whose first attempt may have been applied with its reply lost) is never
// counted twice, and a failed one leaves no ID behind. The client sums the
// diffs of one counter (an upsert may not touch a row twice) and sorts
// them, so that concurrent pushes lock shared rows in the same order and
// do not deadlock, and drops diffs with a zero or non-finite value and
// those of windows that have expired (start + 2*size <= now). The ID's
// record lives as long as the latest counter of the batch, and at least
// five seconds.
//
// # Fetching counters
//
// GetCounters is one query, one round trip: for each key asked (an
// unnest() of the keys), a LATERAL primary key lookup of that key's rows
// in the windows asked, fenced with OFFSET 0 so that the planner cannot
// turn it into a join that scans a namespace or a window, whatever its
// statistics say. Its cost grows with the keys asked, never with the size
// of the table or of the namespace. Counters the table does not hold are
// omitted; a counter that was reset holds 0 and is reported as 0. Reset is
// one upsert of 0 into the current and previous windows of each size.
//
// # Synchronous hits
//
// Hit is a batch of one (see Batches of synchronous hits): a hit with an
// ID records it in <table>_ids, the table that pushes use, so that a hit
// and a batch of diffs of the same ID and namespace are applied at most
// once between them. A hit's ID record lives as long as its counters, but
// at least one minute and at most two.
//
// pgx never resends a query, so a hit is sent at most once. Errors wrap
// strategy.ErrNotSent when the request surely never reached the server:
// no connection could be made or acquired (including a context that ended
// first), the tables could not be created, pgx reports that nothing was
// written (pgconn.SafeToRetry), or the store is closed. Any other error,
// such as a timeout after the query was sent, may come after PostgreSQL
// applied the request; for pushes the batch ID, and for hits the hit ID,
// make the retry safe.
//
// # Batches of synchronous hits
//
// HitBatch is one call of the PL/pgSQL function <table>_hits: one round
// trip for a batch of hits of any keys of a namespace, applied atomically
// and in order, each deciding as if the hits were sent one after the
// other. The client lists the batch's counters once
// each, sorted by key, size and start as pushes sort theirs, and the
// hits' windows refer to them by index. The function records the batch's
// ID in <table>_ids, the record that pushes and hits use, so that a batch
// and a batch of diffs of the same ID and namespace are applied at most
// once between them: both are atomic, so the batch of diffs that carries
// the hits of a failed HitBatch is applied whole if the HitBatch was not,
// and not at all if it was, whatever its diffs. Then, when it applies the
// batch, one upsert locks (or makes, at 0) every counter that a hit
// increments, in that order, so that concurrent batches, hits and pushes
// take shared rows in one order; one query reads every counter by its
// primary key; the hits are decided on running counts in arrays (a
// rejected hit with undo has the counts it found restored); and one upsert
// writes the final count of each counter that changed (a counter made by
// the lock that no hit incremented is deleted). So the hits of a key cost
// one read and two writes per counter per batch. A batch whose ID was
// applied before only reads, and decides each hit on the counts as they
// are.
//
// # Concurrency slots
//
// The store is a strategy.Slotter: it holds the slots of max_concurrent
// across a fleet, in a table and three PL/pgSQL functions next to the
// counters, created by the first slot call (apart from the counters'
// schema, so that a role without the right to create them keeps its
// counters until a DBA makes them):
//
//	<table>_slots (namespace bytea, key bytea, id bytea, expires_at timestamptz,
//	               PRIMARY KEY (namespace, key, id))
//	<table>_slotexp ON <table>_slots (expires_at)
//	FUNCTION <table>_acquire(...), <table>_renew(...), <table>_release(...)
//
// One row is one slot; it expires by the server's clock (clock_timestamp()),
// so the nodes' clocks play no part. Each call is one function call, one
// round trip (plus, once per pooled connection, one to prepare it).
// AcquireSlot first takes a transaction advisory lock of the (namespace,
// key) (a 64-bit FNV-1a hash of the table, the namespace and the key,
// computed by the client), then, each in a statement of its own: deletes
// the key's expired slots (skipping rows another transaction holds),
// counts the unexpired ones and, if fewer than max are held or the ID is
// one of them, upserts the slot. It is atomic because the lock makes the
// acquisitions of a key take turns, and under read committed each
// statement of a function reads a snapshot taken when it starts, after the
// lock was granted, so the count sees every slot committed before it. A
// single SQL statement would read one snapshot taken before it waited for
// the lock, and over-admit; so would a transaction under repeatable read
// or serializable, which the function refuses (the store's connections
// ask for read committed, unless the DSN says otherwise). RenewSlots
// extends, and ReleaseSlots deletes, the rows of the slots given, one
// statement each after taking the locks of their keys in ascending order:
// so a renewal never revives a slot that an acquisition found expired
// and gave away, and renewals and releases of the same slots in different
// orders never deadlock. Expired slots are deleted by the key's next
// acquisition and by the periodic purge (of the stores that use slots),
// so the table never grows without bound. An acquisition costs a lock, an
// index scan of the key's slots (twice) and one upsert; a release or a
// renewal a lock per key and a primary key lookup per slot.
//
// # Bans
//
// The store is a strategy.Banner: it holds the bans of a namespace, for a
// fleet, in two tables and a PL/pgSQL function, created by the first ban
// call:
//
//	<table>_bans (namespace bytea, key_id bytea, key bytea, until_ms bigint,
//	              PRIMARY KEY (namespace, key_id))
//	<table>_banver (namespace bytea PRIMARY KEY, version bigint,
//	                lifted_until_ms bigint)
//	FUNCTION <table>_set_bans(...)
//
// key_id is the key as the other tables hold keys (long keys end in their
// SHA-256), key the whole key, to read back. SetBans is one call of the
// function, which takes a transaction advisory lock of the namespace, so
// that the calls of one namespace take turns, deletes the namespace's bans
// that ended, lifts and upserts (keeping the later end) the bans given,
// and when anything changed sets the namespace's version to the server's
// time in microseconds (or one more than the last), and lifted_until_ms
// to the latest end of a ban it lifted. GetBans is one query: the
// version, 0 when no ban has an end to come and no lifted one would
// have, and, unless the caller knows that version, the bans that have not
// ended. Ended bans are deleted by the namespace's next SetBans and by the
// periodic purge. A <table>_banver of an older version, without
// lifted_until_ms, gains it with the first ban call.
//
// The store is a strategy.Roster: the nodes of a namespace whose
// on_store_failure is share attend it in one table, created by the first
// Attend:
//
//	<table>_fleet (namespace bytea, node bytea, until_ms bigint,
//	               PRIMARY KEY (namespace, node))
//
// Attend is one statement: it upserts the node's row until the server's
// time plus its time to live, deletes the namespace's other rows that
// expired, and counts those that did not, and the node.
//
// # Keys near their limits
//
// The store is a strategy.NearFeed: a push whose batch has a Near marks
// the keys whose diffs bring their windows' counts near their limits, and
// GetCountersNear reads the marks made since a version with the counts.
// Two tables hold the marks, created by the first push that may mark or
// the first read of the marks: in the same transaction as the counters'
// schema when that call makes it too (a node's start costs one round
// trip), and apart from it when a role may not create them, as the bans'
// are:
//
//	<table>_near (namespace bytea, n bigint, key bytea, until_ms bigint,
//	              PRIMARY KEY (namespace, n))
//	<table>_nearexp ON <table>_near (until_ms)
//	<table>_nearver (namespace bytea PRIMARY KEY, version bigint, until_ms bigint)
//
// A push that may mark (Near above 0 and a diff that adds to a window
// with a Limit) is still one statement: the counters' upsert becomes a
// CTE that returns the new counts, the diffs that crossed Near × Limit
// are found by a join with the candidates the client sends, and, when
// there are any, an upsert of the namespace's version row numbers them
// after the namespace's last mark and the marks are inserted; the marks
// before the newest 65,536 are deleted. The version row's lock, held
// until the push commits, makes the marking pushes of a namespace take
// turns after they wrote their counters (so they never wait in a circle),
// and so their numbers commit in order: the version is the number of the
// newest mark, and a reader that read up to it later reads every mark
// made after. A namespace without a version row starts its numbers past
// the server's clock in nanoseconds, so they are never used twice. Other
// pushes (Near 0, or no diff that could mark) send the statement they sent
// before the feed existed, and create none of its tables.
//
// GetCountersNear is one pipeline, so one round trip: the fetch of
// GetCounters (when keys are asked) and one query that reads the version
// row (0 once every mark ended) and, unless the caller is at that version,
// the marks after its version (all of them when it is 0 or ahead) that
// have not ended, among the newest 65,536: one range of the primary key.
// Ended marks, and the version rows of namespaces whose marks all ended,
// are deleted by the periodic purge of the stores that use the feed.
//
// # Expiry
//
// A counter expires when it can no longer be a previous window, plus a
// second for clock skew: start + 2*size + 1s. Rows are deleted by a purge
// that each store in use runs every 30 seconds (first at a random point of
// the first interval, so that nodes spread out). A periodic namespace's
// sync run does it after its own calls (Store.Maintain), on the connection
// they gave back: at a time of its own the purge would now and then find
// that connection busy, and the pool would open another that the node
// keeps. A goroutine that the first call starts and Close stops does it
// when no run did for half an interval more (a store that only
// synchronous namespaces use). A purge deletes expired counters and
// ID records (and slots, by the server's clock, bans and marks near
// limits, in a store that used them) in chunks of 10,000 rows (found through the expires_at
// indexes and deleted by ctid), each chunk in a short transaction that
// holds a transaction-level advisory lock taken with
// pg_try_advisory_xact_lock: while one node purges, the others skip their
// turn. A run stops after 100 chunks; the rest waits for the next run.
// Store.Purge purges at once, waiting for the lock, for tests and tools.
package postgres
