#!/usr/bin/env bash
# deps.sh — make sure the tools the tests drive are here: Dovecot (the IMAP
# server of the sync tests), kcat (an analyst's Kafka client), docker-compose
# (validates docker-compose.yml), promtool (checks and unit-tests the alert
# rules), PostgreSQL's server binaries (private clusters per test run) and
# Chromium with its fonts (the ops console's headless browser test), and
# Python's confluent-kafka and jsonschema (the analyst test's client).
#
# What is missing is installed with apt-get when this runs as root on Debian
# or Ubuntu (package scripts are kept from starting system services: the
# tests start their own). Otherwise it names the packages and the command to
# run, and exits 1. `make test` and .ci/run call it; `make deps` too.
set -euo pipefail
cd "$(dirname "$0")/.."

PG=scripts/pg-private.sh
say() { echo "deps: $*" >&2; }

missing() {
  local need=()
  { [[ -x /usr/sbin/dovecot ]] && command -v doveadm >/dev/null; } || need+=(dovecot-imapd)
  command -v kcat >/dev/null || need+=(kcat)
  command -v docker-compose >/dev/null || need+=(docker-compose)
  command -v promtool >/dev/null || need+=(prometheus)
  bash "$PG" bindir >/dev/null 2>&1 || need+=(postgresql)
  command -v psql >/dev/null || need+=(postgresql-client)
  [[ -x /usr/bin/chromium ]] || need+=(chromium)
  [[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || need+=(fonts-dejavu-core)
  # The analyst test's non-Go client (examples/analyst/read.py).
  /usr/bin/python3 -c 'import confluent_kafka' 2>/dev/null || need+=(python3-confluent-kafka)
  /usr/bin/python3 -c 'import jsonschema' 2>/dev/null || need+=(python3-jsonschema)
  echo "${need[*]}"
}

need=$(missing)
[[ -z $need ]] && exit 0

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  say "the tests need: $need"
  say "install them as root, then run make test again:"
  say "  apt-get update && apt-get install -y --no-install-recommends $need"
  say "(or: sudo make deps)"
  exit 1
fi

say "installing $need"
export DEBIAN_FRONTEND=noninteractive
own_policy=
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  own_policy=1
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -qq
# shellcheck disable=SC2086 # one word per package
apt-get install -y -qq --no-install-recommends $need >/dev/null
if [[ -n $own_policy ]]; then
  rm -f /usr/sbin/policy-rc.d
  trap - EXIT
fi
still=$(missing)
[[ -z $still ]] || { say "still missing after install: $still"; exit 1; }
