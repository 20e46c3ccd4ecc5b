# Sourced by the scripts in scripts/: install_missing installs, from
# Debian's packages, those of the given packages whose commands are not
# found. redis-server needs redis-server and redis-cli; postgresql needs
# initdb on PATH or in /usr/lib/postgresql/*/bin (Debian keeps it there);
# tzdata, the time zone database in /usr/share/zoneinfo; any other
# package needs the command of its name.
install_missing() {
	local missing=() pkg
	for pkg in "$@"; do
		case $pkg in
		redis-server)
			command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server)
			;;
		postgresql)
			command -v initdb >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
			;;
		tzdata)
			[ -e /usr/share/zoneinfo/America/New_York ] || missing+=(tzdata)
			;;
		*)
			command -v "$pkg" >/dev/null || missing+=("$pkg")
			;;
		esac
	done
	[ ${#missing[@]} -gt 0 ] || return 0
	echo "${missing[*]} not found: installing Debian's ${missing[*]}" >&2
	local sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
