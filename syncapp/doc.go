// Package syncapp is the rate_limit Caddy app. It owns the counter zones,
// the namespaces and their sync loops for the life of the server, across
// config reloads, and offers the Go API that the rate_limit HTTP handler
// and other Caddy modules count with.
//
// # What outlives a config
//
// A loaded config's App holds a Namespace per namespace it names. What
// must survive a reload lives in a process-wide caddy.UsagePool
// (defaultPool), as Caddy pools its log writers, each config taking a
// reference in Provision and giving it back in Cleanup:
//
//   - zones ("zone", by name): a zoneHolder, the window.Zone holding the
//     counters, and its sweeper;
//   - fleet states ("namespace", by name): a fleetState, whose parts each
//     own one piece of what a node knows of its fleet, and the loop;
//   - stores ("store", by module and settings): a pooledStore, the open
//     connections; the loop of each namespace that syncs with one holds
//     a reference too, so a store outlives every run that uses it.
//
// # A façade over parts
//
// A Namespace is a façade: its methods are the Go API, and each hands the
// work to the part whose job it is. It holds the parts of its fleetState
// that it asks itself (health, banTable, slotHolder, inFlight), its
// windowSizes, and three parts that join its config's store to the fleet
// state, built when the config is provisioned (Namespace.use):
//
//   - runner (run.go): the sync runs, and what must not fall between a
//     run's push and what it took: Fetch, the store's part of Reset;
//   - storeRoad (synchit.go): the road of the requests that ask the store
//     (synchronous hits and rates, sync_above's near hits, slots, reads);
//   - periodicHits (stale.go): a periodic namespace's hits, decided again
//     on the store's counts when they rejected a stale key.
//
// A request goes from the Namespace to a part and on to the store; a run
// goes from the loop (or Sync, or a flush at stop) to the runner and on to
// the store; neither comes back. Only drivers call the Namespace: the
// config (App) and the admin API (AdminAPI). The loop holds runners, never
// a Namespace: when it calls back through loop.current, it reaches the
// runner attached and nothing above it; the fleet state's metrics read
// the same runner. TestOneOwnerPerState holds that shape.
//
// # Goroutines
//
// Each goroutine the app starts has one owner that stops it:
//
//   - a pooled object's worker (worker.go): the zone's sweeper, the
//     namespace's loop, its slot holder. Each starts when first needed and
//     stops when its object is destructed; a worker recovers and logs a
//     panic and runs its function again.
//   - the loop's canceller, started by the loop's function: it waits for
//     the loop's stop, and cancels the run in flight.
//   - the flushes of a config's Stop and Cleanup (App.flush): one per
//     namespace that pushes, all waited for.
//   - the hit queue's stall check: a timer (time.AfterFunc) armed while
//     hits wait, which ends on its own.
//
// Requests start no goroutine: a synchronous round trip runs on a
// request's own goroutine.
//
// # The parts, and what each lock guards
//
//	runLock     one run at a time: the loop's, Sync, the flushes at stop,
//	            and Fetch and Reset, all the runner's; the loop takes it
//	            too, to let go of stores between runs. What a run took from
//	            the zone is never pushed twice, and a reset never falls
//	            between a push and what it took.
//	outbox      what was taken from the zone and is not in the store yet.
//	  .taking   held by a run from zone.Take until the outbox records what it
//	            took; shared by views, which synchronous hits read: a diff is
//	            always in the zone, on its way, or in the store.
//	  .mu       the batches whose push failed, and the synchronous hits
//	            that failed after they may have been applied (their
//	            increments, and their rates' turns), to push again under
//	            their round trip's ID.
//	  inflight  the sum of what is on its way, per counter (atomic pointer).
//	fetchSet.mu the keys a periodic run fetches, and the fetches made.
//	nearKeys.mu the keys the store's feed marked near their limits, until
//	            their marks end, the feed's version read, and the marks
//	            this node's store-decided hits ask for (a periodic
//	            namespace whose store is a strategy.NearFeed); a request
//	            reads the marks only when some key is marked (an atomic
//	            count). Whether the runs skip the feed (a node with nothing
//	            to fetch rests) is an atomic; the requests that find it
//	            resting share one read of the feed (a singleflight.Group).
//	banTable.mu the bans this node knows of, those to push, the store's version.
//	slotHolder.mu   concurrency slots held in stores, renewed and released
//	            off the request's path by its own goroutine, and those of
//	            requests admitted locally, which a run takes in the store
//	            once the store is back.
//	inFlight.mu requests in flight per key on this node.
//	health.mu   a namespace's failures, backoff and the failure log's
//	            throttle.
//	storeHealth.mu (the pooled store's) the parts of the store that failed
//	            since they last worked, and the namespaces on the store,
//	            which each change reaches: under it, each one's share
//	            policy (on_store_failure share) weighs its zone
//	            namespace's unsynced counts (an atomic) by the fleet's size
//	            while the store or a part is down, by 1 otherwise. Whether
//	            the whole store failed, and how many parts did, are
//	            atomics: requests look a key's part up only while some are
//	            down, and never probe; the loop's runs do.
//	fleetMembers (atomics, no lock) this node's member ID, the fleet's
//	            size the runs learned from the store's roster, and when.
//	windowSizes (one per config's Namespace, an atomic pointer, no lock)
//	            the namespace's window sizes, which its runs fetch and a
//	            reset clears.
//	runner      (one per config's Namespace, no lock of its own) the sync
//	            runs with the config's store; whether they read the store's
//	            bans is an atomic, set by the config's handlers.
//	storeRoad   (one per config's Namespace, no lock of its own) the road
//	            of what a request asks of the store (synchronous hits,
//	            rates, slots, a stale key's read, a peek): the store its
//	            hits go to (tripStore), and what a refusal, a failure, a
//	            stall or a doubt does to each (storeRoad.trip).
//	periodicHits    (one per config's Namespace, no lock of its own) a
//	            periodic namespace's second look at a stale key.
//	hitQueue.mu (the fleet state's, so one round trip is out per
//	            namespace, reloads included) the synchronous hits waiting
//	            for a round trip, each with its config's store, the round
//	            trips out, the stall check.
//	batchRetry  (atomics, no lock) the increments of a failed round trip's
//	            hits, each in its own slot.
//	loop.mu     the runners attached (the reload hand-off) and the store
//	            references the loop holds.
//	zoneHolder.mu   the capacities the configs that hold a zone want.
//	running     (an atomic pointer, no lock) the started apps, newest
//	            last, for the admin API.
//
// Locks are taken in this order, and no other lock is taken while holding
// one of the later ones: runLock (held across a whole run, with any lock
// taken under it), then outbox.taking, then the zone's shard locks or
// outbox.mu. A view (outbox.taking, shared) is held while the zone
// observes what the store answered, so outbox.taking comes before the
// shard locks there too. More orders: zoneHolder.mu, then each shard lock
// of its zone (a capacity change resizes the zone); the pool's lock
// (Caddy's), then loop.mu, outbox.mu and banTable.mu (the metrics'
// collector holds the pool's read lock while it reads each fleet state:
// loop.current, the pending diffs, the bans), so the loop takes and gives
// back its references to stores without loop.mu. Every other lock is a leaf: held only for its
// own fields, never across a store's round trip, nor while logging.
//
// Each lock is a lockorder one, of a class (locks.go), which declares
// this order: a build with the lockorder tag checks every lock taken
// against it, and scripts/test.sh runs the package's tests so.
//
// # One request and one run
//
//	request: Namespace.Hit(key), or HitRate(key) with a rate (sync_rate 0,
//	  or local); HitIfRoom and HitRateIfRoom take the same roads. While
//	  the store is down, on_store_failure deny has the handler refuse it
//	  first (Namespace.Refuses), and share has the window zone weigh
//	  this node's unsynced counts by the fleet's size (health.applyShare)
//	  local ──► window zone: count, decide (a rate first, then the limits)
//	  periodic ──► periodicHits.hit ──► window zone: count, decide
//	    a resting node (its runs had nothing to fetch, and skip the
//	    feed): periodicHits.wake first ──► store.GetCountersNear, the
//	    marks alone, one read for the requests that come meanwhile,
//	    held stalled (health.stalled) past stallAfter
//	    a key the store's feed marked near a limit, which the runs do not
//	    fetch (periodicHits.blind): periodicHits.refresh first
//	    rejected, a key the runs no longer fetch: periodicHits.refresh
//	      ──► storeRoad.read: a hit of the hit queue that increments nothing
//	          (or store.GetCounters, when the store takes no hits)
//	      ──► zone.Observe ──► fetchSet.touch ──► window zone: decide again
//	  periodic with sync_above ──► storeRoad.hitNear ──► zone.HitUnlessNear:
//	    far from every limit ──► counted, decided; near one ──► as below,
//	    with the key's diffs taken from the zone; a key the feed marked
//	    that the runs do not fetch (periodicHits.blind) is near; a hit
//	    whose increment brought a window near its limit at the store has
//	    the next run mark the key (storeAnswer ──►
//	    periodicHits.decidedAtStore ──► nearKeys.ask)
//	  sync_rate 0 (Hit: storeRoad.hit; HitRate: storeRoad.rateHit):
//	    health.downFor? ──yes──► window zone
//	    storeRoad ──► outbox.epoch ──► hitQueue.do: sent at once when no
//	      round trip is out (two, for a store without HitBatch), with
//	      those queued while it yields once, else waits and goes with
//	      the others in the next, when one ends (with those that queue
//	      until its sender runs)
//	      ──► store.HitBatch (one round trip; the store decides each hit,
//	          a rate first, its turn given back when a limit rejects)
//	      ok      ──► health.succeededFor ──► storeRoad.observe:
//	              outbox.view ──► zone.Observe (store + on its way; only
//	              rising, zone.ObserveAtLeast, when a push landed since
//	              the epoch), and for a rate zone.ObserveRate (the TAT)
//	      stalled (no answer 250 ms while hits wait) ──► health.stalled
//	              ──► the waiting hits: window zone
//	      failed  ──► health.fail ──► zone counts it ──► batchRetry
//	              (its increments, and its rate's turn if the zone
//	              admitted it) ──► (last hit of the round trip) outbox.retry
//	  Peek (a concurrency rejection's Retry-After) at sync_rate 0:
//	    storeRoad.read, which leaves the zone as it is; PeekRate reads the
//	    zone's TAT, without a round trip
//
//	request: Namespace.Acquire(key) with max_concurrent and a store
//	  health.downFor? ──yes──► inFlight (and slotHolder.admitLocal)
//	  slotHolder.acquire ──► storeRoad.takeSlot: a hit of the hit queue,
//	    as above, that takes a slot (or store.AcquireSlot, when the store
//	    takes no slots in its round trips) ──► slotHolder: held, renewed
//	    and released off the path; in doubt, released again until its
//	    lease ends
//
//	run: loop timer (loop.current: the runner attached), or Sync, or a
//	  flush at stop ──► runner.runLocked, under the run lock
//	  outbox.lockTake ──► zone.Take ──► outbox.load ──► fetchSet.touch
//	  outbox.deliver ──► store.PushDiffs (retries, failed batch, new batch;
//	    with a feed, the new batch asks the store to mark the keys whose
//	    windows it brings to nearShare of their limits)
//	  fetchSet.due ──► wait for the beat ──► store.GetCounters ──► zone.Apply
//	    (with a feed: store.GetCountersNear, the marks since nearKeys.known
//	    ──► nearKeys.add, in the same round trip, which also makes the
//	    marks asked for that no mark read covers, nearKeys.takeAsked, and
//	    then remembers them, nearKeys.made; no key due: nearKeys.rest,
//	    and no read)
//	  with a feed and no fetch, the marks asked for ──► store.MarkNear
//	    ──► nearKeys.made (runner.markAsked)
//	  (the store failing: first a probe, the outbox's batch or a ping; the
//	  zone's diffs stay in the zone until it answers)
//	  banTable.sync ──► store.SetBans, store.GetBans (version 0 while
//	    bans this node holds are in force: the store lost them ──►
//	    store.SetBans of those, store.GetBans)
//	  on_store_failure share: fleetMembers.attend ──► store.Attend,
//	    every second or sync_rate, the fleet's size
//	  nothing asked and the store failing ──► store.Ping; nothing asked
//	    with on_store_failure share or deny ──► store.Ping within stallAfter
//	  a failure or a success ──► health ──► storeHealth: every namespace
//	    on the store knows it (storeHealth.change)
//	  requests admitted locally still running ──► slotHolder.adopt
//	  health.failedRun / health.succeeded ──► the loop's next delay:
//	    while failing, a probe 250 ms after the failure, then up to 1 s apart
//	  a run of the loop that went well ──► runner.maintain ──►
//	    store.Maintain (strategy.Maintainer): the store's housekeeping when
//	    due, such as PostgreSQL's purge, on a connection the run gave back
package syncapp
