#!/usr/bin/env bash
# Checks observability/ against a real Prometheus. It starts a redis-server
# and three Caddy nodes with this plugin on loopback, sends them a modest,
# bounded load, and starts Debian's prometheus scraping the nodes' admin
# /metrics every second with the shipped rules (observability/prometheus-rules.yml,
# unchanged: the check waits out their `for`). Then:
#
#   - promtool check rules;
#   - on the healthy fleet, every query of the Grafana dashboard and every
#     value an alert compares (its expression without the final comparison)
#     must return series, and no alert may be pending or firing;
#   - the store is paused (SIGSTOP) while a flood of new keys passes a
#     small zone: RateLimitStoreDown must fire within its `for` plus 30 s;
#     then it is killed and started again, and RateLimitStoreDown must clear
#     within 30 s. The other alerts that fire are shown with their timings.
#
# It takes about three minutes. It installs Debian's prometheus and
# redis-server when they are missing, sends requests to 127.0.0.1 only,
# and stops everything it started when it ends; the machine's own Redis is
# never touched.
#
#	./scripts/check-observability.sh
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/debian.sh
install_missing prometheus redis-server curl jq python3

rules=$PWD/observability/prometheus-rules.yml
dashboard=$PWD/observability/grafana-dashboard.json
rate_interval=30s # what $__rate_interval stands for in the dashboard's queries
for_slack=30      # seconds an alert may take past its `for`: detection, scrapes, evaluations

work=$(mktemp -d "${TMPDIR:-/tmp}/check-observability.XXXXXX")
pids=()
redis_pid=""
load_pid=""
cleanup() {
	local pid
	touch "$work/stop-load"
	[ -n "$load_pid" ] && kill "$load_pid" 2>/dev/null
	[ -n "$redis_pid" ] && kill -CONT "$redis_pid" 2>/dev/null
	for pid in ${redis_pid:+"$redis_pid"} "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
fail() {
	echo "FAIL: $*"
	failures=$((failures + 1))
}

# A port nobody listens on, from the kernel's ephemeral range.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# wait_for URL TRIES: polls URL every 0.1 s until it answers 2xx.
wait_for() {
	local i
	for ((i = 0; i < $2; i++)); do
		curl -sf -o /dev/null --max-time 2 "$1" && return 0
		sleep 0.1
	done
	return 1
}

start_redis() {
	redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >>"$work/redis.log" 2>&1 &
	redis_pid=$!
	local i
	for ((i = 0; i < 100; i++)); do
		redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "redis-server did not start:" >&2
	cat "$work/redis.log" >&2
	exit 1
}

echo "== versions"
prometheus --version 2>&1 | head -1
promtool --version 2>&1 | head -1
redis-server --version

echo "== promtool check rules"
promtool check rules "$rules" || fail "promtool check rules"

redis_port=$(free_port)
start_redis

echo "== building Caddy with the plugin"
go build -o "$work/caddy" ./cmd/caddy

# Three namespaces on one Redis: api (periodic, with bans), sync
# (synchronous) and flood (periodic, in a zone of 50 keys, for the
# fault phase).
cat >"$work/node.Caddyfile" <<'EOF'
{
	admin 127.0.0.1:{$ADMIN_PORT}
	auto_https off
	rate_limit {
		zone small {
			max_keys 50
		}
		namespace api {
			sync_rate 100ms
			strategy redis {
				addresses {$REDIS_ADDR}
			}
		}
		namespace sync {
			sync_rate 0
			strategy redis {
				addresses {$REDIS_ADDR}
			}
		}
		namespace flood {
			zone small
			sync_rate 100ms
			strategy redis {
				addresses {$REDIS_ADDR}
			}
		}
	}
}

http://127.0.0.1:{$NODE_PORT} {
	bind 127.0.0.1
	handle /api {
		rate_limit {
			namespace api
			key {http.request.uri.query.c}
			limit 20 1s
			ban 3s
		}
		respond "ok" 200
	}
	handle /sync {
		rate_limit {
			namespace sync
			key {http.request.uri.query.c}
			limit 20 1s
		}
		respond "ok" 200
	}
	handle /flood {
		rate_limit {
			namespace flood
			key {http.request.uri.query.c}
			limit 1000 1m
		}
		respond "ok" 200
	}
}
EOF

nodes=() admins=()
for n in 1 2 3; do
	node_port=$(free_port)
	admin_port=$(free_port)
	NODE_PORT=$node_port ADMIN_PORT=$admin_port REDIS_ADDR=127.0.0.1:$redis_port \
		"$work/caddy" run --config "$work/node.Caddyfile" --adapter caddyfile >"$work/node$n.log" 2>&1 &
	pids+=($!)
	nodes+=("$node_port")
	admins+=("$admin_port")
done
for n in 0 1 2; do
	if ! wait_for "http://127.0.0.1:${admins[$n]}/metrics" 300; then
		echo "node $((n + 1)) did not start:" >&2
		tail -20 "$work/node$((n + 1)).log" >&2
		exit 1
	fi
done
echo "redis-server on 127.0.0.1:$redis_port; nodes on 127.0.0.1:${nodes[*]}; admin (metrics) on 127.0.0.1:${admins[*]}"

# The load: every 0.2 s, 18 requests spread over the nodes (90 a second);
# the key "hot" goes past its limit (rejected, then banned). Bounded by a round count
# and by the stop file.
load() {
	local round urls=() n
	for n in 0 1 2; do
		urls+=("http://127.0.0.1:${nodes[$n]}/api?c=hot" "http://127.0.0.1:${nodes[$n]}/api?c=hot"
			"http://127.0.0.1:${nodes[$n]}/api?c=a$n" "http://127.0.0.1:${nodes[$n]}/sync?c=hot"
			"http://127.0.0.1:${nodes[$n]}/sync?c=s$n" "http://127.0.0.1:${nodes[$n]}/flood?c=steady")
	done
	for ((round = 0; round < 2000; round++)); do
		[ -e "$work/stop-load" ] && break
		curl -s -Z --parallel-max 6 --max-time 5 "${urls[@]}" >/dev/null 2>&1 || true
		sleep 0.2
	done
}
load &
load_pid=$!
curl -s "http://127.0.0.1:${admins[0]}/metrics" | grep -q '^caddy_rate_limit_requests_total' ||
	fail "the admin endpoint's /metrics serves no caddy_rate_limit_requests_total"

prom_port=$(free_port)
targets=$(printf '"127.0.0.1:%s",' "${admins[@]}")
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $rules
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: [${targets%,}]
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
	--web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)
prom=http://127.0.0.1:$prom_port
if ! wait_for "$prom/-/ready" 300; then
	echo "prometheus did not start:" >&2
	cat "$work/prometheus.log" >&2
	exit 1
fi
echo "prometheus on 127.0.0.1:$prom_port, scraping every 1 s, evaluating the rules every 1 s"

# count QUERY: the number of series an instant query returns, or "error: ...".
count() {
	curl -s --max-time 10 -G "$prom/api/v1/query" --data-urlencode "query=$1" |
		jq -r 'if .status == "success" then (.data.result | length) else "error: \(.error)" end'
}

# alerts: "name state namespace-or-zone instance" per active alert.
alerts() {
	curl -s --max-time 10 "$prom/api/v1/alerts" |
		jq -r '.data.alerts[] | "\(.labels.alertname) \(.state) \(.labels.namespace // .labels.zone) \(.labels.instance)"'
}

# Wait for every node to be scraped, then for enough samples for rates.
for ((i = 0; i < 300; i++)); do
	[ "$(curl -s "$prom/api/v1/query" --data-urlencode 'query=sum(up{job="caddy"})' | jq -r '.data.result[0].value[1] // 0')" = 3 ] && break
	sleep 0.1
done
echo "waiting 25 s for samples under load..."
sleep 25

echo "== dashboard queries on the healthy fleet (series)"
while IFS=$'\t' read -r title ref expr; do
	expr=${expr//\$__rate_interval/$rate_interval}
	expr=${expr//\$instance/.*}
	expr=${expr//\$namespace/.*}
	n=$(count "$expr")
	printf '%4s  %s [%s]\n' "$n" "$title" "$ref"
	if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then fail "panel \"$title\" [$ref] returns $n series: $expr"; fi
done < <(jq -r '.panels[] | select(.targets) | .title as $t | .targets[] | [$t, .refId, .expr] | @tsv' "$dashboard")
while IFS=$'\t' read -r name query; do
	# label_values(<selector>, <label>) lists the values of label in selector's series.
	if [[ $query =~ ^label_values\((.*),[[:space:]]*([a-zA-Z_]+)\)$ ]]; then
		expr="count by (${BASH_REMATCH[2]}) (${BASH_REMATCH[1]})"
		expr=${expr//\$instance/.*}
		n=$(count "$expr")
	else
		n="not label_values(...)"
	fi
	printf '%4s  variable $%s: %s\n' "$n" "$name" "$query"
	if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then fail "variable \$$name returns $n values: $query"; fi
done < <(jq -r '.templating.list[] | select(.type == "query") | [.name, .definition] | @tsv' "$dashboard")

echo "== alert rules on the healthy fleet (series of the value compared / of the alert)"
rules_json=$(curl -s "$prom/api/v1/rules")
if [ "$(jq '[.data.groups[].rules[] | select(.type == "alerting")] | length' <<<"$rules_json")" -eq 0 ]; then
	fail "prometheus loaded no alerting rule"
fi
while IFS=$'\t' read -r name query duration health; do
	if [ "$health" = err ]; then fail "rule $name: health err"; fi
	value=$(sed -E 's/[[:space:]]*(==|!=|>=|<=|>|<)[[:space:]]*[0-9.]+[[:space:]]*$//' <<<"$query")
	if [ "$value" = "$query" ]; then
		fail "rule $name does not end with a comparison to a number: $query"
		continue
	fi
	nv=$(count "$value")
	na=$(count "$query")
	printf '%4s / %s  %s (for %ss)\n' "$nv" "$na" "$name" "$duration"
	if ! [[ $nv =~ ^[1-9][0-9]*$ ]]; then fail "rule $name: its value returns $nv series: $value"; fi
	if [ "$na" != 0 ]; then fail "rule $name holds on a healthy fleet ($na series): $query"; fi
done < <(jq -r '.data.groups[].rules[] | select(.type == "alerting") | [.name, .query, .duration, .health] | @tsv' <<<"$rules_json")

echo "== alerts on the healthy fleet, over 10 s"
for ((i = 0; i < 10; i++)); do
	active=$(alerts)
	if [ -n "$active" ]; then
		fail "alerts on the healthy fleet: $active"
		break
	fi
	sleep 1
done
if [ -z "$active" ]; then echo "none pending or firing"; fi

store_down_for=$(jq -r '.data.groups[].rules[] | select(.name == "RateLimitStoreDown") | .duration' <<<"$rules_json")
store_down_for=${store_down_for:-60}

echo "== fault: redis-server paused (SIGSTOP), a flood of 300 new keys per node into zone small (max_keys 50)"
kill -STOP "$redis_pid"
start=$(date +%s.%N)
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }
flood=()
for n in 0 1 2; do
	for k in $(seq 300); do flood+=("http://127.0.0.1:${nodes[$n]}/flood?c=f$k"); done
done
curl -s -Z --parallel-max 10 --max-time 10 "${flood[@]}" >/dev/null 2>&1 || true
echo "flood sent at +$(elapsed "$start") s"

declare -A seen=()
fired=0
stores=$(count caddy_rate_limit_store_up) # node-namespace pairs with a store
deadline=$((store_down_for + for_slack))
while :; do
	t=$(elapsed "$start")
	while read -r name state what instance; do
		[ -n "$name" ] || continue
		key="$name $state $what $instance"
		if [ -z "${seen[$key]:-}" ]; then
			seen[$key]=$t
			printf '+%6s s  %-22s %-8s %s %s\n' "$t" "$name" "$state" "$what" "$instance"
		fi
	done < <(alerts)
	# Every node counts every namespace locally: wait until each fired.
	fired=$(alerts | grep -c '^RateLimitStoreDown firing' || true)
	if [ "$fired" -ge "$stores" ]; then break; fi
	if python3 -c "import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))" "$t" "$deadline"; then
		break
	fi
	sleep 1
done
if [ "$fired" -lt "$stores" ]; then
	fail "RateLimitStoreDown fired for $fired of $stores node-namespaces within ${deadline} s of the store's pause"
else
	echo "RateLimitStoreDown firing for all $stores node-namespaces at +$(elapsed "$start") s (its for: ${store_down_for} s)"
fi
# Let the alerts whose `for` started later catch up a little.
sleep 5
echo "== alert rules during the fault (series of the value compared / of the alert)"
while IFS=$'\t' read -r name query; do
	value=$(sed -E 's/[[:space:]]*(==|!=|>=|<=|>|<)[[:space:]]*[0-9.]+[[:space:]]*$//' <<<"$query")
	printf '%4s / %s  %s\n' "$(count "$value")" "$(count "$query")" "$name"
done < <(jq -r '.data.groups[].rules[] | select(.type == "alerting") | [.name, .query] | @tsv' <<<"$rules_json")
echo "active alerts:"
alerts | awk '{print $1, $2}' | sort | uniq -c | awk '{printf "  %s %s: %s\n", $2, $3, $1}'

echo "== redis-server killed and started again on the same port"
kill -KILL "$redis_pid"
wait "$redis_pid" 2>/dev/null || true
start_redis
start=$(date +%s.%N)
cleared=""
for ((i = 0; i < for_slack; i++)); do
	if ! alerts | grep -q '^RateLimitStoreDown '; then
		cleared=1
		break
	fi
	sleep 1
done
if [ -n "$cleared" ]; then
	echo "RateLimitStoreDown cleared on every node +$(elapsed "$start") s after the store came back"
else
	fail "RateLimitStoreDown still active ${for_slack} s after the store came back: $(alerts | grep '^RateLimitStoreDown')"
fi
sleep 2
echo "store_up: $(curl -s -G "$prom/api/v1/query" --data-urlencode 'query=min(caddy_rate_limit_store_up)' | jq -r '.data.result[0].value[1]')" \
	"(min over nodes and namespaces); still active (their windows still hold the fault):"
alerts | awk '{print $1, $2}' | sort | uniq -c | awk '{printf "  %s %s: %s\n", $2, $3, $1}'
touch "$work/stop-load"

if [ "$failures" -gt 0 ]; then
	echo "== $failures check(s) failed"
	exit 1
fi
echo "== every check passed"
