#!/usr/bin/env bash
# pg-private.sh — run a private PostgreSQL cluster from the system's binaries.
#
#   scripts/pg-private.sh start DIR PORT   initdb if needed, start (or reuse), create db "mailplane"
#   scripts/pg-private.sh stop  DIR PORT   stop it (fast mode); fine if not running
#   scripts/pg-private.sh url   DIR PORT   print the connection URL
#   scripts/pg-private.sh bindir           print the directory holding initdb/pg_ctl (exit 1 if none)
#
# Same layout and settings as the Go package pgcluster, so either can reuse a
# cluster the other created: DIR/pgdata (data), DIR/run (unix socket),
# DIR/postgres.log, DIR/pgdata/mailplane.conf. Listens on 127.0.0.1:PORT only,
# trust auth, superuser "postgres". initdb refuses to run as root, so as root
# the server runs as $PG_PRIVATE_USER (default postgres), which must be able to
# reach DIR (put it under /tmp or another world-traversable path).
set -euo pipefail

DB=mailplane
RUN_AS=${PG_PRIVATE_USER:-postgres}

die() { echo "pg-private: $*" >&2; exit 1; }
say() { echo "pg-private: $*" >&2; }

# bindir: PATH first, else the newest /usr/lib/postgresql/N/bin (Debian keeps
# the server binaries there, off PATH).
bindir() {
  local p d
  if p=$(command -v pg_ctl 2>/dev/null) && command -v initdb >/dev/null 2>&1; then
    d=$(dirname "$(readlink -f "$p")")
    [[ -x $d/initdb ]] && { echo "$d"; return 0; }
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [[ -x $d/pg_ctl && -x $d/initdb ]] && { echo "$d"; return 0; }
  done
  return 1
}

# as_pg runs a command as the server's user (ourselves unless root), from DIR
# because that user may not be able to enter our working directory.
as_pg() {
  if [[ $EUID -eq 0 ]]; then
    (cd "$DIR" && runuser -u "$RUN_AS" -- "$@")
  else
    (cd "$DIR" && "$@")
  fi
}

# running_port prints the port of a live server on DIR/pgdata, or nothing.
# postmaster.pid: line 1 pid, line 4 port. A stale file is ignored, as
# postgres itself ignores it.
running_port() {
  local f=$DIR/pgdata/postmaster.pid pid port
  [[ -r $f ]] || return 0
  pid=$(sed -n 1p "$f"); port=$(sed -n 4p "$f")
  [[ $pid =~ ^[0-9]+$ && $port =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null && echo "$port"
  return 0
}

url() { echo "postgres://postgres@127.0.0.1:$PORT/$DB?sslmode=disable"; }

write_conf() {
  # Keep in step with pgcluster.writeConf.
  cat >"$DIR/pgdata/mailplane.conf" <<EOF
# Written by mailplane scripts/pg-private.sh on every start; edits are lost.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR/run'
# Many test packages run in parallel, each test with its own small pool.
max_connections = 200
shared_buffers = 128MB
# fsync and synchronous_commit stay on: measurements made here must hold in production.
log_line_prefix = '%m [%p] '
EOF
  [[ $EUID -eq 0 ]] && chown "$RUN_AS:" "$DIR/pgdata/mailplane.conf"
  chmod 600 "$DIR/pgdata/mailplane.conf"
}

start() {
  local bin running
  bin=$(bindir) || die "PostgreSQL server binaries (initdb, pg_ctl) not found in PATH or /usr/lib/postgresql/*/bin; install them (apt-get install postgresql) or set MAILPLANE_DATABASE_URL to use an existing server"
  (( ${#DIR} + 20 < 108 )) || die "DIR $DIR is too long for a unix socket path (107 bytes); use a shorter one"

  mkdir -p -m 0755 "$DIR"
  mkdir -p -m 0700 "$DIR/pgdata"
  mkdir -p -m 0755 "$DIR/run"
  if [[ $EUID -eq 0 ]]; then
    id -u "$RUN_AS" >/dev/null 2>&1 || die "user $RUN_AS does not exist; install the postgresql package (it creates it) or set PG_PRIVATE_USER"
    chown "$RUN_AS:" "$DIR" "$DIR/pgdata" "$DIR/run"
    [[ -e $DIR/postgres.log ]] && chown "$RUN_AS:" "$DIR/postgres.log"
    runuser -u "$RUN_AS" -- test -x "$DIR" || die "$DIR is not reachable by user $RUN_AS (a parent directory is not traversable); use a directory under /tmp"
  fi

  if [[ ! -f $DIR/pgdata/PG_VERSION ]]; then
    say "initdb $DIR/pgdata ($bin)"
    as_pg "$bin/initdb" -D "$DIR/pgdata" -U postgres -A trust -E UTF8 --no-locale --no-instructions >"$DIR/initdb.log" 2>&1 \
      || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
    printf "\n# Added by mailplane pgcluster / scripts/pg-private.sh.\ninclude_if_exists = 'mailplane.conf'\n" >>"$DIR/pgdata/postgresql.conf"
  fi

  running=$(running_port)
  if [[ -n $running && $running != "$PORT" ]]; then
    die "a server from $DIR/pgdata is already running on port $running, not $PORT; stop it first"
  elif [[ -n $running ]]; then
    say "reusing server already running on port $PORT"
  else
    write_conf
    say "starting on 127.0.0.1:$PORT (socket dir $DIR/run, log $DIR/postgres.log)"
    as_pg "$bin/pg_ctl" start -D "$DIR/pgdata" -l "$DIR/postgres.log" -w -t 60 >/dev/null \
      || { tail -n 30 "$DIR/postgres.log" >&2 || true; die "pg_ctl start failed; see $DIR/postgres.log"; }
  fi

  local psql=$bin/psql
  [[ -x $psql ]] || psql=$(command -v psql) || die "psql not found; install postgresql-client"
  if [[ -z $("$psql" -XAtq -h 127.0.0.1 -p "$PORT" -U postgres -d postgres \
             -c "SELECT 1 FROM pg_database WHERE datname = '$DB'") ]]; then
    "$psql" -Xq -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE $DB" >/dev/null
    say "created database $DB"
  fi
}

stop() {
  local bin
  if [[ -z $(running_port) ]]; then
    say "not running ($DIR)"
    return 0
  fi
  bin=$(bindir) || die "pg_ctl not found"
  as_pg "$bin/pg_ctl" stop -D "$DIR/pgdata" -m fast -w -t 60 >/dev/null
  say "stopped ($DIR)"
}

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}
case $cmd in
  bindir) bindir || die "PostgreSQL server binaries not found"; exit 0 ;;
  start|stop|url) [[ $# -eq 3 ]] || usage ;;
  *) usage ;;
esac
DIR=$(realpath -m "$2")
PORT=$3
[[ $PORT =~ ^[0-9]+$ ]] || die "PORT must be a number, got $PORT"
"$cmd"
