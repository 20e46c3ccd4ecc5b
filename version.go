package ratelimit

import "github.com/ratesync/caddy-ratelimit/syncapp"

// Version is the version of this module, as CHANGELOG.md names its
// releases. The rate_limit app logs it when it starts and reports it as
// the metric caddy_rate_limit_build_info{version="..."} = 1.
const Version = syncapp.Version
