#!/usr/bin/env bash
# Prepares the dashboard page and its screenshot driver (tools/dashboards/view):
#   - Debian's Chromium (apt-get, when /usr/bin/chromium is missing; needs root),
#     which playwright-core drives: no browser is downloaded,
#   - the npm packages pinned by tools/dashboards/view/package-lock.json (npm ci,
#     skipped while node_modules matches the lockfile),
#   - the page built into tools/dashboards/view/dist (vite build, when its sources changed).
# Idempotent. Needs node (>= 20.19) and npm.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
view="$repo/tools/dashboards/view"
log() { echo "dashboard-view: $*" >&2; }

if [ ! -x /usr/bin/chromium ]; then
	if [ "$(id -u)" != 0 ]; then
		log "/usr/bin/chromium missing; run as root to apt-get install chromium"
		exit 1
	fi
	log "installing chromium"
	env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null ||
		{ apt-get update -qq && env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
fi

cd "$view"
# npm ci rewrites node_modules; skip it while the installed tree is the
# lockfile's (npm keeps a copy of the lockfile it installed).
if ! cmp -s package-lock.json node_modules/.package-lock.json.installed; then
	log "npm ci"
	npm ci --no-audit --no-fund --loglevel=error
	cp package-lock.json node_modules/.package-lock.json.installed
fi
# Build again only when an input is newer than the last build.
if [ -f dist/index.html ] && [ -z "$(find src index.html vite.config.js package-lock.json -newer dist/index.html -print -quit)" ]; then
	exit 0
fi
log "vite build"
npx --no-install vite build --logLevel error
