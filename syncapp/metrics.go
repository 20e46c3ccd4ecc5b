package syncapp

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/caddy-ratelimit/internal/promreg"
)

// metrics are process-wide: built once and registered into every config's
// registry, so their values survive reloads. Labels are namespace or zone
// names, never a client key.
var metrics = struct {
	once         sync.Once
	syncDuration *prometheus.HistogramVec
	syncErrors   *prometheus.CounterVec
	hitBatch     *prometheus.HistogramVec
	timeouts     *prometheus.CounterVec
	pool         prometheus.Collector
}{}

func initMetrics() {
	metrics.once.Do(func() {
		metrics.syncDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "caddy_rate_limit_sync_duration_seconds",
			Help:    "Time one sync run of a namespace took: pushing its diffs and fetching counts.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"namespace"})
		metrics.syncErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caddy_rate_limit_sync_errors_total",
			Help: "Failed syncs and synchronous hits of a namespace, by namespace.",
		}, []string{"namespace"})
		metrics.hitBatch = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "caddy_rate_limit_sync_hit_batch_size",
			Help:    "Synchronous hits of a namespace sent to its store in one round trip.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}, []string{"namespace"})
		metrics.timeouts = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caddy_rate_limit_store_timeouts_total",
			Help: "Failures of a namespace's store that were timeouts: sync runs, synchronous hits (each hit of a round trip) and stalls.",
		}, []string{"namespace"})
		metrics.pool = poolCollector{}
	})
}

// initStoreMetrics gives a namespace that syncs with a store a series at
// 0 in each of its counters and its sync duration, so that a query or an
// alert on them finds the namespace before its first failure or run.
func initStoreMetrics(namespace string) {
	initMetrics()
	metrics.syncErrors.WithLabelValues(namespace)
	metrics.timeouts.WithLabelValues(namespace)
	metrics.syncDuration.WithLabelValues(namespace)
}

// registerMetrics registers the app's collectors into reg, which may
// already hold them.
func registerMetrics(reg prometheus.Registerer) error {
	initMetrics()
	return promreg.Register(reg, metrics.syncDuration, metrics.syncErrors, metrics.hitBatch, metrics.timeouts, metrics.pool)
}

var (
	pendingDesc = prometheus.NewDesc("caddy_rate_limit_pending_diffs",
		"Diffs of a namespace waiting to be pushed to its store.", []string{"namespace"}, nil)
	keysDesc = prometheus.NewDesc("caddy_rate_limit_keys",
		"Keys a zone holds.", []string{"zone"}, nil)
	capacityDesc = prometheus.NewDesc("caddy_rate_limit_max_keys",
		"Keys a zone can hold.", []string{"zone"}, nil)
	evictionsDesc = prometheus.NewDesc("caddy_rate_limit_evictions_total",
		"Keys evicted from a full zone.", []string{"zone"}, nil)
	droppedDesc = prometheus.NewDesc("caddy_rate_limit_dropped_diffs_total",
		"Unpushed diffs of evicted keys dropped because too many waited for a store.", []string{"zone"}, nil)
	bansDesc = prometheus.NewDesc("caddy_rate_limit_bans",
		"Keys of a namespace this node holds as banned whose ban has not ended.", []string{"namespace"}, nil)
	droppedBansDesc = prometheus.NewDesc("caddy_rate_limit_dropped_bans_total",
		"Bans a node dropped to make room when it held as many as its zone holds keys.", []string{"namespace"}, nil)
	nearKeysDesc = prometheus.NewDesc("caddy_rate_limit_near_keys",
		"Keys of a namespace that its store marked near their limits, as this node last read them: a request for one that this node's runs do not fetch asks the store first.",
		[]string{"namespace"}, nil)
	storeUpDesc = prometheus.NewDesc("caddy_rate_limit_store_up",
		"1 when a namespace's store worked the last time this node asked it, 0 while the node counts locally (from a failure to the next success).",
		[]string{"namespace"}, nil)
	storePartsDownDesc = prometheus.NewDesc("caddy_rate_limit_store_parts_down",
		"On a store made of parts that fail one at a time (a Redis Cluster: 1,024 parts spread over its masters' slots), the parts that failed since they last worked: their keys count locally while the others sync. 0 when none did.",
		[]string{"namespace"}, nil)
	fleetNodesDesc = prometheus.NewDesc("caddy_rate_limit_fleet_nodes",
		"Nodes of a namespace's fleet, as this node last learned them from the store: what on_store_failure share divides each limit by while the store is away. Only for share namespaces that reached their store.",
		[]string{"namespace"}, nil)
	syncIntervalDesc = prometheus.NewDesc("caddy_rate_limit_sync_interval_seconds",
		"How often a namespace's sync loop runs when its store works: sync_rate, or the retry interval of a synchronous namespace.",
		[]string{"namespace"}, nil)
)

// poolCollector reports the pooled zones and namespaces when scraped, so
// the figures are those of the live objects whatever config holds them.
type poolCollector struct{}

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		pendingDesc, keysDesc, capacityDesc, evictionsDesc, droppedDesc, bansDesc, droppedBansDesc, nearKeysDesc, storeUpDesc, syncIntervalDesc, fleetNodesDesc, storePartsDownDesc,
	} {
		ch <- d
	}
}

func (poolCollector) Collect(ch chan<- prometheus.Metric) {
	defaultPool.Range(func(_, v any) bool {
		switch o := v.(type) {
		case *zoneHolder:
			z := o.zone
			ch <- prometheus.MustNewConstMetric(keysDesc, prometheus.GaugeValue, float64(z.Len()), o.name)
			ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(z.Capacity()), o.name)
			ch <- prometheus.MustNewConstMetric(evictionsDesc, prometheus.CounterValue, float64(z.Evictions()), o.name)
			ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(z.Dropped()), o.name)
		case *fleetState:
			ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(o.pendingDiffs()), o.name)
			ch <- prometheus.MustNewConstMetric(bansDesc, prometheus.GaugeValue, float64(o.bans.inForce(time.Now().UnixNano())), o.name)
			ch <- prometheus.MustNewConstMetric(droppedBansDesc, prometheus.CounterValue, float64(o.bans.droppedCount()), o.name)
			ch <- prometheus.MustNewConstMetric(nearKeysDesc, prometheus.GaugeValue, float64(o.near.count()), o.name)
			if n := o.members.size(); n > 0 {
				ch <- prometheus.MustNewConstMetric(fleetNodesDesc, prometheus.GaugeValue, float64(n), o.name)
			}
			// Only a namespace with a store has a store's health and a
			// sync interval: those of the newest config attached.
			if interval, ok := o.syncInterval(); ok {
				up := 0.0
				if !o.health.down() {
					up = 1
				}
				ch <- prometheus.MustNewConstMetric(storeUpDesc, prometheus.GaugeValue, up, o.name)
				ch <- prometheus.MustNewConstMetric(storePartsDownDesc, prometheus.GaugeValue, float64(o.health.partsDown()), o.name)
				ch <- prometheus.MustNewConstMetric(syncIntervalDesc, prometheus.GaugeValue, interval.Seconds(), o.name)
			}
		}
		return true
	})
}
