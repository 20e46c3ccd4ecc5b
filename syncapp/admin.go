package syncapp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/window"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// adminTimeout bounds the store's round trips of one admin request.
const adminTimeout = 10 * time.Second

// AdminAPI serves the rate_limit app's routes on Caddy's admin endpoint
// (module admin.api.rate_limit), for operators to look at and reset keys:
//
//	GET    /rate_limit/namespaces
//	GET    /rate_limit/namespaces/<namespace>/keys?key=<key>[&source=store]
//	DELETE /rate_limit/namespaces/<namespace>/keys?key=<key>
//	GET    /rate_limit/namespaces/<namespace>/bans[?limit=<n>]
//
// The first lists the namespaces: name, mode, sync_rate, zone, window
// sizes, keys held, bans held, diffs waiting to be pushed, and store
// module. The second reads one key's windows, for every window size:
// start, current, previous, sliding rate and this node's pending diffs;
// with source=store, the counts are the store's. The third resets the key
// on this node and in the store (Namespace.Reset), and lifts its ban; the
// other nodes take the reset at their next sync. The fourth lists the bans
// in force that this node holds, latest end first: at most limit (default
// 1000), with their total. The key is any bytes, URL-encoded (so "+" must
// be sent as %2B); namespace names are path-escaped. Answers are JSON; an
// unknown namespace is 404 and a missing key 400, with Caddy's JSON error
// body.
//
// These routes are as privileged as /load: Caddy's admin access controls
// (the admin listener, origins, remote admin's access keys and their
// allowed paths and methods) apply to them.
type AdminAPI struct {
	logger *zap.Logger
	// app returns the app to work with; nil means the running one.
	app func() *App
}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Provision sets up the logger. Caddy provisions admin routers in the
// context of the config being loaded, before its apps; the routes find
// the running app at each request instead (see runningApp).
func (a *AdminAPI) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	if ctx.Module() == nil {
		// Admin routers are not loaded as modules of the context, so
		// they get Caddy's default logger (caddyserver/caddy#5032).
		a.logger = a.logger.Named("admin.api.rate_limit")
	}
	return nil
}

// Routes returns the routes under /rate_limit/.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/rate_limit/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// running holds the started apps, oldest first. The admin routes work
// with the newest: during a reload, the new config's app starts before the
// old one stops, and if the new config fails to start, its app stops and
// the old one, still running, is the newest again. A registry of started
// apps follows exactly that, where caddy.ActiveContext (experimental) only
// changes after every app of the new config started, and its App method
// would create and provision an app of its own in a config that has none,
// from the admin's goroutine, unsynchronized with the config.
var running atomic.Pointer[[]*App]

// register records a started app.
func (a *App) register() {
	update(&running, func(apps []*App) []*App { return append(apps, a) })
}

// unregister forgets a stopping app.
func (a *App) unregister() {
	update(&running, func(apps []*App) []*App {
		return slices.DeleteFunc(apps, func(o *App) bool { return o == a })
	})
}

// runningApp returns the newest started app that has not stopped, or nil.
func runningApp() *App {
	if p := running.Load(); p != nil && len(*p) > 0 {
		return (*p)[len(*p)-1]
	}
	return nil
}

// namespaceInfo is one namespace in the answer of GET /rate_limit/namespaces.
type namespaceInfo struct {
	Name         string   `json:"name"`
	Mode         string   `json:"mode"`
	SyncRate     string   `json:"sync_rate"`
	SyncAbove    float64  `json:"sync_above,omitempty"`
	Zone         string   `json:"zone"`
	WindowSizes  []string `json:"window_sizes"`
	Keys         int      `json:"keys"`
	PendingDiffs int      `json:"pending_diffs"`
	// Bans is the number of keys this node holds as banned whose ban has
	// not ended.
	Bans  int    `json:"bans"`
	Store string `json:"store,omitempty"`
	// OnStoreFailure is the namespace's on_store_failure, and FleetNodes
	// the fleet's size this node last learned (share only).
	OnStoreFailure string `json:"on_store_failure,omitempty"`
	FleetNodes     int    `json:"fleet_nodes,omitempty"`
	// StorePartsDown is, on a store made of parts that fail one at a time
	// (a Redis Cluster's slots, in 1,024 parts), how many parts failed
	// since they last worked: their keys count locally.
	StorePartsDown int `json:"store_parts_down,omitempty"`
}

// keyInfo is the answer of GET and DELETE /rate_limit/namespaces/<ns>/keys.
type keyInfo struct {
	Namespace string `json:"namespace"`
	// Key is URL-encoded, as the request gives it: a key is any bytes,
	// which a JSON string cannot always hold.
	Key     string       `json:"key"`
	Source  string       `json:"source"`
	Windows []windowInfo `json:"windows"`
	// BannedUntil is when the key's ban ends, as this node knows it, if
	// it is banned.
	BannedUntil *time.Time `json:"banned_until,omitempty"`
}

// windowInfo is one window size of a key.
type windowInfo struct {
	Size  string    `json:"size"`
	Start time.Time `json:"start"`
	// A calendar window's time zone and end (its size is day, week or
	// month, its start and end in local time).
	Timezone string     `json:"timezone,omitempty"`
	End      *time.Time `json:"end,omitempty"`

	Current  float64 `json:"current"`
	Previous float64 `json:"previous"`
	Sliding  float64 `json:"sliding"`
	// This node's diffs of the current and previous windows that wait to
	// be pushed; only when the counts are this node's.
	Pending         *float64 `json:"pending,omitempty"`
	PendingPrevious *float64 `json:"pending_previous,omitempty"`
}

// Sources of a key's counts.
const (
	sourceNode  = "node"
	sourceStore = "store"
)

// apiError is an error Caddy's admin server answers with status and the
// JSON body {"error": "<err>"}.
func apiError(status int, err error) error { return caddy.APIError{HTTPStatus: status, Err: err} }

// serve routes a request under /rate_limit/.
func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	var parts []string
	for _, p := range strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/rate_limit/"), "/") {
		s, err := url.PathUnescape(p)
		if err != nil {
			return apiError(http.StatusBadRequest, fmt.Errorf("path: %v", err))
		}
		parts = append(parts, s)
	}
	if n := len(parts); n > 1 && parts[n-1] == "" {
		parts = parts[:n-1] // a trailing slash
	}
	methods, serve := []string{http.MethodGet}, func() error { return nil }
	switch {
	case len(parts) == 1 && parts[0] == "namespaces":
		serve = func() error { return a.listNamespaces(w) }
	case len(parts) == 3 && parts[0] == "namespaces" && parts[2] == "keys":
		methods = append(methods, http.MethodDelete)
		serve = func() error { return a.serveKey(w, r, parts[1]) }
	case len(parts) == 3 && parts[0] == "namespaces" && parts[2] == "bans":
		serve = func() error { return a.listBans(w, r, parts[1]) }
	default:
		return apiError(http.StatusNotFound, fmt.Errorf("resource not found: %s", r.URL.Path))
	}
	if err := allow(w, r, methods...); err != nil {
		return err
	}
	return serve()
}

// allow refuses a method the route does not take, naming those it does.
func allow(w http.ResponseWriter, r *http.Request, methods ...string) error {
	if slices.Contains(methods, r.Method) {
		return nil
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	return apiError(http.StatusMethodNotAllowed, fmt.Errorf("method not allowed: %s (allowed: %s)", r.Method, strings.Join(methods, ", ")))
}

// theApp returns the app the routes work with, or a 404 when none runs.
func (a *AdminAPI) theApp() (*App, error) {
	get := a.app
	if get == nil {
		get = runningApp
	}
	if app := get(); app != nil {
		return app, nil
	}
	return nil, apiError(http.StatusNotFound, errors.New("the rate_limit app is not running"))
}

// namespace returns the running app's namespace of that name, or a 404.
func (a *AdminAPI) namespace(name string) (*Namespace, error) {
	app, err := a.theApp()
	if err != nil {
		return nil, err
	}
	ns, err := app.Namespace(name)
	if err != nil {
		return nil, apiError(http.StatusNotFound, err)
	}
	return ns, nil
}

// listNamespaces answers GET /rate_limit/namespaces, by name.
func (a *AdminAPI) listNamespaces(w http.ResponseWriter) error {
	app, err := a.theApp()
	if err != nil {
		return err
	}
	out := make([]namespaceInfo, 0, len(app.namespaces))
	for _, name := range slices.Sorted(maps.Keys(app.namespaces)) {
		ns := app.namespaces[name]
		syncRate := SyncRate(ns.rate) // 0 unless periodic
		if ns.mode == Local {
			syncRate = SyncOff
		}
		info := namespaceInfo{
			Name:         name,
			Mode:         ns.mode.String(),
			SyncRate:     syncRate.String(),
			SyncAbove:    ns.syncAbove,
			WindowSizes:  []string{},
			Keys:         ns.counters.Len(),
			PendingDiffs: ns.runner.pendingDiffs(),
			Bans:         ns.bans.inForce(time.Now().UnixNano()),
			Store:        ns.storeModule,
			// On a store not made of parts, always 0.
			StorePartsDown: ns.health.partsDown(),
		}
		if ns.store != nil {
			info.OnStoreFailure = string(ns.onFailure)
		}
		if ns.onFailure == FailShare {
			info.FleetNodes = ns.members.size()
		}
		for zname, zh := range app.zones {
			if zh.zone == ns.counters.Zone() {
				info.Zone = zname
			}
		}
		for _, s := range ns.WindowSizes() {
			info.WindowSizes = append(info.WindowSizes, sizeName(s))
		}
		out = append(out, info)
	}
	return writeJSON(w, out)
}

// defaultBansListed is how many bans GET .../bans lists without limit.
const defaultBansListed = 1000

// bansInfo is the answer of GET /rate_limit/namespaces/<ns>/bans.
type bansInfo struct {
	Namespace string `json:"namespace"`
	// Total is the number of bans in force that this node holds; Bans
	// lists at most limit of them.
	Total int       `json:"total"`
	Bans  []banInfo `json:"bans"`
}

// banInfo is one ban: the key, URL-encoded as in keyInfo, and its end.
type banInfo struct {
	Key   string    `json:"key"`
	Until time.Time `json:"until"`
}

// listBans answers GET /rate_limit/namespaces/<ns>/bans[?limit=<n>]: the
// bans in force that this node holds, latest end first.
func (a *AdminAPI) listBans(w http.ResponseWriter, r *http.Request, namespace string) error {
	ns, err := a.namespace(namespace)
	if err != nil {
		return err
	}
	limit := defaultBansListed
	if v := r.URL.Query().Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 {
			return apiError(http.StatusBadRequest, fmt.Errorf("limit: want a whole number of 1 or more, got %q", v))
		}
	}
	bans, total := ns.bans.active(time.Now().UnixNano(), limit)
	out := bansInfo{Namespace: ns.name, Total: total, Bans: make([]banInfo, 0, len(bans))}
	for _, b := range bans {
		out.Bans = append(out.Bans, banInfo{Key: url.QueryEscape(b.Key), Until: b.Until.UTC()})
	}
	return writeJSON(w, out)
}

// serveKey reads or resets one key of a namespace.
func (a *AdminAPI) serveKey(w http.ResponseWriter, r *http.Request, namespace string) error {
	ns, err := a.namespace(namespace)
	if err != nil {
		return err
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return apiError(http.StatusBadRequest, fmt.Errorf("query %q: %v", r.URL.RawQuery, err))
	}
	keys, ok := q["key"]
	switch {
	case !ok:
		return apiError(http.StatusBadRequest, errors.New("key: missing: give the key as the query parameter key, URL-encoded"))
	case len(keys) > 1:
		return apiError(http.StatusBadRequest, fmt.Errorf("key: given %d times, want once", len(keys)))
	}
	key := keys[0]
	source := cmp.Or(q.Get("source"), sourceNode)
	switch {
	case source != sourceNode && source != sourceStore:
		return apiError(http.StatusBadRequest, fmt.Errorf("source: unknown source %q: want node or store", source))
	case source == sourceStore && ns.store == nil:
		return apiError(http.StatusBadRequest, fmt.Errorf("source: namespace %q is local only: it has no store", ns.name))
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	// A client key longer than MaxKeyLen is held bounded, as the handler
	// bounds it; a key of a bounded key's length may be one already.
	named := namedKeys(key)
	if r.Method == http.MethodDelete {
		if source != sourceNode {
			return apiError(http.StatusBadRequest, errors.New("source: a reset is always of this node and the store"))
		}
		for _, k := range named {
			if err := ns.Reset(ctx, k); err != nil {
				return apiError(http.StatusBadGateway, err)
			}
		}
		a.logger.Info("reset a key", zap.String("namespace", ns.name))
	}
	held := named[0]
	for _, k := range named {
		if len(ns.counters.Inspect(k)) > 0 || !ns.BannedUntil(k).IsZero() {
			held = k
			break
		}
	}
	info, err := describeKey(ctx, ns, held, source)
	if err != nil {
		return apiError(http.StatusBadGateway, err)
	}
	info.Key = url.QueryEscape(key)
	return writeJSON(w, info)
}

// describeKey reads key's windows in ns, of the namespace's window sizes
// and of any other size this node holds for it, from this node or from
// the store.
func describeKey(ctx context.Context, ns *Namespace, key, source string) (keyInfo, error) {
	held := ns.counters.Inspect(key)
	heldSizes := make([]time.Duration, len(held))
	for i, w := range held {
		heldSizes[i] = w.Size
	}
	sizes := ns.sizes.with(heldSizes, source == sourceStore)
	info := keyInfo{Namespace: ns.name, Key: url.QueryEscape(key), Source: source, Windows: []windowInfo{}}
	if until := ns.BannedUntil(key); !until.IsZero() {
		info.BannedUntil = &until
	}
	now := ns.counters.Now()
	if source == sourceStore {
		counts, err := ns.store.GetCounters(ctx, ns.name, []string{key}, sizes, time.Unix(0, now))
		if err != nil {
			return info, fmt.Errorf("reading a key of namespace %q from the %s store: %w", ns.name, ns.storeModule, err)
		}
		for _, size := range sizes {
			s := emptySample(size, now) // a window the store does not hold counts zero
			for _, c := range counts {
				switch {
				case c.Key != key || c.Size != size:
				case c.Start == s.Start:
					s.Current = c.Value
				case c.Start == s.Start-int64(c.Size):
					s.Previous = c.Value
				}
			}
			info.Windows = append(info.Windows, windowOf(s))
		}
		return info, nil
	}
	for _, size := range sizes {
		kw := window.KeyWindow{Sample: emptySample(size, now)} // not held: zero, no diff
		if i := slices.IndexFunc(held, func(w window.KeyWindow) bool { return w.Size == size }); i >= 0 {
			kw = held[i]
		}
		w := windowOf(kw.Sample)
		w.Pending, w.PendingPrevious = &kw.PendingCurrent, &kw.PendingPrevious
		info.Windows = append(info.Windows, w)
	}
	return info, nil
}

// sizeName names a window size as the admin API shows it: a duration, or
// a calendar window's unit and time zone ("month America/New_York").
func sizeName(size time.Duration) string {
	if unit, loc, ok := window.CalendarOf(size); ok {
		return unit.String() + " " + loc.String()
	}
	return size.String()
}

// windowOf is a window's sample as the admin API shows it.
func windowOf(s window.Sample) windowInfo {
	w := windowInfo{
		Size:     s.Size.String(),
		Start:    time.Unix(0, s.Start).UTC(),
		Current:  s.Current,
		Previous: s.Previous,
		Sliding:  s.Sliding(),
	}
	if unit, loc, ok := window.CalendarOf(s.Size); ok {
		end := time.Unix(0, window.End(s.Start, s.Size)).In(loc)
		w.Size, w.Timezone, w.Start, w.End = unit.String(), loc.String(), w.Start.In(loc), &end
	}
	return w
}

// emptySample is the sample of a window with no counts, at now (Unix
// nanoseconds).
func emptySample(size time.Duration, now int64) window.Sample {
	return window.Sample{Weight: window.Weight(now, size), Start: window.Start(now, size), Size: size, At: now}
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return apiError(http.StatusInternalServerError, fmt.Errorf("encoding the answer: %v", err))
	}
	w.Header().Set("Content-Type", "application/json")
	_, err = w.Write(append(b, '\n'))
	return err
}

// Interface guards
var (
	_ caddy.Module      = (*AdminAPI)(nil)
	_ caddy.Provisioner = (*AdminAPI)(nil)
	_ caddy.AdminRouter = (*AdminAPI)(nil)
)
