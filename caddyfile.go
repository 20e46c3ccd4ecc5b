package ratelimit

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ratesync/caddy-ratelimit/internal/cfargs"
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
	if err := cfargs.NoArgs(d); err != nil {
		return err
	}
	parse := h.subdirectives(d)
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if seen[sub] && sub != "limit" {
			return d.Errf("%s: given twice", sub)
		}
		seen[sub] = true
		fn, ok := parse[sub]
		if !ok {
			return d.Errf("unrecognized subdirective '%s'", sub)
		}
		if err := fn(); err != nil {
			return err
		}
	}
	if len(h.Limits) == 0 && h.Rate == nil {
		return d.Err("rate_limit needs at least one 'limit <n> <window>' or a 'rate <n>/<window>'")
	}
	return nil
}

// subdirectives returns the parser of each subdirective, which reads its
// arguments into h. Provision checks the values, as it does JSON's; the
// parsers refuse only what does not parse, and the few values whose
// Caddyfile errors show the Caddyfile's syntax (a limit, a status).
func (h *Handler) subdirectives(d *caddyfile.Dispenser) map[string]func() error {
	return map[string]func() error{
		"namespace": func() error { return cfargs.One(d, &h.Namespace) },
		"key": func() error {
			if keys := d.RemainingArgs(); len(keys) > 0 {
				h.Key, h.KeyFallbacks = keys[0], keys[1:]
				return nil
			}
			return d.ArgErr()
		},
		"ipv4_prefix": func() error { return cfargs.IntRange(d, "ipv4_prefix", 1, 32, &h.IPv4Prefix) },
		"ipv6_prefix": func() error { return cfargs.IntRange(d, "ipv6_prefix", 1, 128, &h.IPv6Prefix) },
		"limit": func() error {
			l, err := parseLimit(d.RemainingArgs())
			if err != nil {
				return d.Err(err.Error())
			}
			h.Limits = append(h.Limits, l)
			return nil
		},
		"timezone": func() error { return cfargs.One(d, &h.Timezone) },
		"rate": func() error {
			r, err := parseRate(d.RemainingArgs())
			if err != nil {
				return d.Err(err.Error())
			}
			h.Rate = r
			return nil
		},
		"window_type": func() error { return cfargs.One(d, &h.WindowType) },
		"headers": func() error {
			if h.Headers = d.RemainingArgs(); len(h.Headers) == 0 {
				return d.Errf("headers: want draft, kong, both (draft kong), or none")
			}
			if len(h.Headers) == 1 && h.Headers[0] == "both" {
				// The JSON spells both out, as the handler's docs do.
				h.Headers = []string{"draft", "kong"}
			}
			return nil
		},
		"retry_after_jitter": func() error { return cfargs.Duration(d, "retry_after_jitter", &h.RetryAfterJitter) },
		"error_code": func() error {
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			code, err := strconv.Atoi(v)
			if err != nil || code < 400 || code > 599 {
				return d.Errf("error_code: want a status from 400 to 599, got %q", v)
			}
			h.ErrorCode = code
			return nil
		},
		"max_concurrent": func() error { return cfargs.Int(d, "max_concurrent", 0, &h.MaxConcurrent) },
		"max_delay":      func() error { return cfargs.Duration(d, "max_delay", &h.MaxDelay) },
		"max_waiting":    func() error { return cfargs.Int(d, "max_waiting", 1, &h.MaxWaiting) },
		"ban":            func() error { return cfargs.Duration(d, "ban", &h.Ban) },
		"cost":           func() error { return cfargs.One(d, (*string)(&h.Cost)) },
		"response_cost":  func() error { return cfargs.One(d, (*string)(&h.ResponseCost)) },
		"count_status": func() error {
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
			return nil
		},
		"disable_penalty":     func() error { return cfargs.Flag(d, &h.DisablePenalty) },
		"hide_client_headers": func() error { return cfargs.Flag(d, &h.HideClientHeaders) },
		"draft_headers":       func() error { return cfargs.Flag(d, &h.DraftHeaders) },
		"dry_run":             func() error { return cfargs.Flag(d, &h.DryRun) },
	}
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
