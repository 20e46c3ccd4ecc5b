package syncapp

import "github.com/ratesync/caddy-ratelimit/internal/lockorder"

// The classes of the package's locks, one per lock field (see doc.go), and
// the order doc.go states, which a build with the lockorder tag checks.
type (
	runLockClass    struct{}
	takingLock      struct{}
	outboxLock      struct{}
	fetchSetLock    struct{}
	nearKeysLock    struct{}
	banTableLock    struct{}
	slotHolderLock  struct{}
	inFlightLock    struct{}
	healthLock      struct{}
	storeHealthLock struct{}

	hitQueueLock struct{}

	loopLock       struct{}
	zoneHolderLock struct{}
	runningLock    struct{}
)

var _ = lockorder.Outer("syncapp.runLockClass") && lockorder.Order(
	"syncapp.takingLock < window.shardLock",
	"syncapp.takingLock < syncapp.outboxLock",
	"syncapp.zoneHolderLock < window.shardLock",
)
