// Package postgres is the PostgreSQL storage strategy of the rate limiter:
// the Caddy module rate_limit.strategies.postgres. It keeps the shared
// window counters of every node in one table of a PostgreSQL database
// (version 13 or later), through a pgx connection pool. The tables and
// functions it creates, and how its statements use them, are described in
// docs/stores.md (PostgreSQL objects and rights).
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
// A store creates the objects a call needs, when they are missing, with
// that call: the counters' and ID tables with the first call, and the
// objects of synchronous hits, concurrency slots, bans, rates, the feed of
// keys near their limits and the fleet's members each with the first call
// that uses them, apart, so that a role that may not create objects keeps
// its counters when it upgrades, until a DBA creates the new ones. Each
// creation is one transaction under an advisory lock, so that nodes
// starting together take turns. A function whose body is not this
// version's is replaced, which needs the right to; a role without it uses
// the function a DBA made. Should someone drop the objects, the call that
// finds them missing fails and the next creates them again. A role that
// may not create the feed's tables syncs without the feed, logs a warning
// and tries again a minute later.
//
// Namespaces, keys and IDs are stored as bytea and only ever travel as
// bound parameters; one longer than a B-tree entry may be (a namespace or
// an ID of over 256 bytes, a key of over 1,024) is stored as its first
// bytes followed by its SHA-256, which keeps it distinct. Window sizes
// must be whole milliseconds.
//
// # Calls
//
// Every call is one round trip (plus, the first time a statement runs on
// a pooled connection, one to prepare it): PushDiffs is one statement
// whatever the number of diffs; GetCounters one query that looks up the
// keys asked by primary key, whose cost grows with the keys asked, never
// with the size of the table; HitBatch (and Hit, a batch of one) one call
// of a PL/pgSQL function, with its slots' acquisitions in the same
// pipeline; GetCountersNear one pipeline; the slot calls,
// SetBans and GetBans one call or query each. Rates, slots, bans and
// members expire by the server's clock, so the nodes' clocks play no part
// there.
//
// A batch of diffs, a synchronous hit and a batch of hits of the same ID
// and namespace are applied at most once between them, each whole or not
// at all (see strategy.BatchHitter): a retry under the ID is safe. pgx
// never resends a query. Errors wrap strategy.ErrNotSent when the request
// surely never reached the server: no connection could be made or
// acquired (including a context that ended first), the objects could not
// be created, pgx reports that nothing was written (pgconn.SafeToRetry),
// or the store is closed. Any other error, such as a timeout after the
// query was sent, may come after PostgreSQL applied the request.
//
// # Expiry
//
// A counter expires when it can no longer be a previous window, plus a
// second for clock skew: start + 2*size + 1s. Each store in use purges
// expired rows every 30 seconds (first at a random point of the first
// interval, so that nodes spread out), in chunks of 10,000 rows, each in
// a short transaction that holds an advisory lock: while one node purges,
// the others skip their turn, and a run stops after 100 chunks. A
// periodic namespace's sync run does it after its own calls
// (Store.Maintain), on the connection they gave back, so that the pool
// does not open a second connection for it; a goroutine that the first
// call starts and Close stops does it when no run did for half an interval
// more. A store purges only the objects it used. Store.Purge purges at
// once, waiting for the lock, for tests and tools.
package postgres
