#!/bin/sh
# Append NOTE to the table fenced_log in the database that holds leaderd's lease table, in
# a transaction that PostgreSQL commits only while this node's term leads the election
# (docs/fencing.md): leaderd_fence() raises (SQLSTATE LD001) for any other term, and holds
# the lease row until the commit, so no hand-over lands in between.
#   postgres-fenced-insert.sh NOTE
# Environment: DATABASE_URL (libpq's), LEADERD_ELECTION (default), LEADERD_TERM (default:
# this node's term from GET /leader on LEADERD_SOCKET), LEADERD_FENCE (the function,
# default leaderd_fence). Exits 0 when written, 1 when refused, 2 when psql cannot run.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 NOTE" >&2; exit 2; }
ELECTION="${LEADERD_ELECTION:-default}"
FENCE_TERM="${LEADERD_TERM:-$(curl -sf --unix-socket "${LEADERD_SOCKET:-/run/leaderd/leaderd.sock}" \
    "http://localhost/leader/$ELECTION" | sed -n 's/.*"term":\([0-9]*\).*/\1/p' || true)}"
[ -n "$FENCE_TERM" ] || { echo "refused: this node does not lead $ELECTION" >&2; exit 1; }
set +e
psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 -v election="$ELECTION" -v term="$FENCE_TERM" \
    -v note="$1" -v fence="${LEADERD_FENCE:-leaderd_fence}" <<'SQL'
CREATE TABLE IF NOT EXISTS fenced_log (term bigint NOT NULL, note text);
BEGIN;
INSERT INTO fenced_log (term, note) SELECT :"fence"(:'election', :term), :'note';
COMMIT;
SQL
status=$?
set -e
case $status in
0) echo "written with term $FENCE_TERM" ;;
3) echo "refused: the statement failed (LD001: term $FENCE_TERM does not lead $ELECTION)" >&2
   exit 1 ;;
*) echo "psql could not run (exit $status)" >&2; exit 2 ;;
esac
