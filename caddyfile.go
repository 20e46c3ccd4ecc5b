package ratelimit

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ratesync/caddy-ratelimit/internal/cfargs"
	"github.com/ratesync/caddy-ratelimit/window"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	// Before basic_auth, and so before every handler that answers a
	// request (respond, reverse_proxy, php_fastcgi, file_server...).
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var rl Handler
	err := rl.UnmarshalCaddyfile(h.Dispenser)
	return &rl, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rate_limit [<matcher>] {
//	    namespace <name>
//	    key <placeholders> [<fallback placeholders>...]
//	    ipv4_prefix <bits>
//	    ipv6_prefix <bits>
//	    limit <n|placeholders> <window|day|week|month>
//	    timezone <IANA name>
//	    rate <n|placeholders>/<window> [burst <m|placeholders>]
//	    window_type sliding|fixed
//	    disable_penalty
//	    headers draft|kong|both|none
//	    retry_after_jitter <duration>
//	    error_code <status>
//	    dry_run
//	    max_concurrent <n>
//	    max_delay <duration>
//	    max_waiting <n>
//	    cost <number|placeholders>
//	    response_cost <number|placeholders>
//	    count_status <status...>
//	    ban <duration>
//	}
//
// limit may be repeated, once per window; every other subdirective may be
// given once. A handler needs a limit or a rate (or both). The count of a
// limit, and a rate's n and burst, may be placeholders read per request,
// such as {plan_quota}. headers takes draft (the default), kong, both (draft kong),
// or none; key's further arguments are fallbacks, tried in order while
// the key renders empty; hide_client_headers and draft_headers, older spellings of
// headers none and of adding draft, still load.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if seen[sub] && sub != "limit" {
			return d.Errf("%s: given twice", sub)
		}
		seen[sub] = true
		switch sub {
		case "namespace":
			if err := cfargs.One(d, &h.Namespace); err != nil {
				return err
			}
		case "key":
			var keys []string
			if err := cfargs.List(d, &keys); err != nil {
				return err
			}
			h.Key, h.KeyFallbacks = keys[0], keys[1:]
		case "ipv4_prefix":
			if err := cfargs.IntRange(d, "ipv4_prefix", 1, 32, &h.IPv4Prefix); err != nil {
				return err
			}
		case "ipv6_prefix":
			if err := cfargs.IntRange(d, "ipv6_prefix", 1, 128, &h.IPv6Prefix); err != nil {
				return err
			}
		case "window_type":
			if err := cfargs.One(d, &h.WindowType); err != nil {
				return err
			}
			if h.WindowType != "sliding" && h.WindowType != "fixed" {
				return d.Errf("window_type: unknown window type %q: want sliding or fixed", h.WindowType)
			}
		case "limit":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("limit: want <n> <window>, such as 'limit 100 1m' or 'limit 10000 month'")
			}
			n, placeholders, err := parseAmount(args[0], "limit")
			if err != nil || placeholders == "" && !(n > 0) {
				return d.Errf("limit: the limit must be a positive number or placeholders, got %q", args[0])
			}
			if _, ok := window.ParseUnit(args[1]); ok {
				h.Limits = append(h.Limits, Limit{Limit: n, Calendar: args[1], Placeholders: placeholders})
				break
			}
			win, err := caddy.ParseDuration(args[1])
			if err != nil || win <= 0 {
				return d.Errf("limit: the window must be a positive duration or day, week or month, got %q", args[1])
			}
			h.Limits = append(h.Limits, Limit{Limit: n, Window: caddy.Duration(win), Placeholders: placeholders})
		case "timezone":
			if err := cfargs.One(d, &h.Timezone); err != nil {
				return err
			}
		case "rate":
			r, err := parseRate(d.RemainingArgs())
			if err != nil {
				return d.Err(err.Error())
			}
			h.Rate = r
		case "headers":
			h.Headers = d.RemainingArgs()
			if len(h.Headers) == 0 {
				return d.Errf("headers: want draft, kong, both (draft kong), or none")
			}
			if len(h.Headers) == 1 && h.Headers[0] == "both" {
				// The JSON spells both out, as the handler's docs do.
				h.Headers = []string{"draft", "kong"}
			}
			if err := h.parseHeaders(); err != nil {
				return d.Err(err.Error())
			}
		case "retry_after_jitter":
			if err := cfargs.Duration(d, "retry_after_jitter", &h.RetryAfterJitter); err != nil {
				return err
			}
		case "error_code":
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			code, err := strconv.Atoi(v)
			if err != nil || code < 400 || code > 599 {
				return d.Errf("error_code: want a status from 400 to 599, got %q", v)
			}
			h.ErrorCode = code
		case "max_concurrent":
			if err := cfargs.Int(d, "max_concurrent", 0, &h.MaxConcurrent); err != nil {
				return err
			}
		case "max_delay":
			if err := cfargs.Duration(d, "max_delay", &h.MaxDelay); err != nil {
				return err
			}
		case "max_waiting":
			if err := cfargs.Int(d, "max_waiting", 1, &h.MaxWaiting); err != nil {
				return err
			}
		case "ban":
			if err := cfargs.Duration(d, "ban", &h.Ban); err != nil {
				return err
			}
		case "cost":
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			h.Cost = caddyhttp.WeakString(v)
			if err := h.parseCost(); err != nil {
				return d.Err(err.Error())
			}
		case "response_cost":
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			if err := checkResponseCost(v); err != nil {
				return d.Err(err.Error())
			}
			h.ResponseCost = caddyhttp.WeakString(v)
		case "count_status":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.Errf("count_status: want one or more statuses, such as 'count_status 401 403'")
			}
			for _, a := range args {
				code, err := strconv.Atoi(a)
				if err != nil || code < 100 || code > 599 {
					return d.Errf("count_status: want statuses from 100 to 599, got %q", a)
				}
				h.CountStatus = append(h.CountStatus, code)
			}
		case "disable_penalty", "hide_client_headers", "draft_headers", "dry_run":
			if d.NextArg() {
				return d.ArgErr()
			}
			switch sub {
			case "disable_penalty":
				h.DisablePenalty = true
			case "hide_client_headers":
				h.HideClientHeaders = true
			case "draft_headers":
				h.DraftHeaders = true
			case "dry_run":
				h.DryRun = true
			}
		default:
			return d.Errf("unrecognized subdirective '%s'", sub)
		}
	}
	if len(h.Limits) == 0 && h.Rate == nil {
		return d.Err("rate_limit needs at least one 'limit <n> <window>' or a 'rate <n>/<window>'")
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
