package syncapp

import "github.com/ratesync/caddy-ratelimit/internal/lockorder"

// The classes of the package's locks, one per lock field (see doc.go), and
// the order doc.go states, which a build with the lockorder tag checks.
type (
	runLockClass     struct{}
	takingLock       struct{}
	outboxLock       struct{}
	retryQueueLock   struct{}
	fetchSetLock     struct{}
	nearKeysLock     struct{}
	banTableLock     struct{}
	slotHolderLock   struct{}
	inFlightLock     struct{}
	healthLock       struct{}
	failureShareLock struct{}
	partHealthLock   struct{}
	storeHealthLock  struct{}
	windowSizesLock  struct{}
	hitQueueLock     struct{}
	batchRetryLock   struct{}
	loopLock         struct{}
	zoneHolderLock   struct{}
	runningLock      struct{}
)

var _ = lockorder.Outer("syncapp.runLockClass") && lockorder.Order(
	"syncapp.takingLock < window.shardLock",
	"syncapp.takingLock < syncapp.outboxLock",
	"syncapp.takingLock < syncapp.retryQueueLock",
	"syncapp.healthLock < syncapp.failureShareLock",
	"syncapp.zoneHolderLock < window.shardLock",
)
