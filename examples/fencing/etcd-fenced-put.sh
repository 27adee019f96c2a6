#!/bin/sh
# Put KEY VALUE in etcd only while this node's term leads the election (docs/fencing.md):
# one etcd transaction compares the leader key's mod revision, which names one tenure.
#   etcd-fenced-put.sh KEY VALUE
# Environment: ETCDCTL_ENDPOINTS (and etcdctl's TLS and user settings), LEADERD_ELECTION
# (default), LEADERD_PREFIX (the backend URL's prefix, /leaderd/), LEADERD_TERM (default:
# this node's term from GET /leader on LEADERD_SOCKET). Exits 0 when written, 1 when refused.
# Needs etcdctl (API v3), curl and jq 1.6 or later. VALUE: no quotes, no new lines.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 KEY VALUE" >&2; exit 2; }
export ETCDCTL_API=3
ELECTION="${LEADERD_ELECTION:-default}"
LEADER_KEY="${LEADERD_PREFIX:-/leaderd/}${ELECTION}/leader"
FENCE_TERM="${LEADERD_TERM:-$(curl -sf --unix-socket "${LEADERD_SOCKET:-/run/leaderd/leaderd.sock}" \
    "http://localhost/leader/$ELECTION" | jq -r .term || true)}"
[ -n "$FENCE_TERM" ] || { echo "refused: this node does not lead $ELECTION" >&2; exit 1; }
# The tenure of this term: the leader key's mod revision, if the key names this term.
TENURE=$(etcdctl get "$LEADER_KEY" -w json | jq -r --argjson term "$FENCE_TERM" \
    '.kvs[0] // empty | select((.value | @base64d | fromjson | .term) == $term) | .mod_revision')
[ -n "$TENURE" ] || { echo "refused: term $FENCE_TERM does not lead $ELECTION" >&2; exit 1; }
# Compare and put in one transaction: a release, an expiry or a new tenure since the read
# changes the mod revision (a deleted key's is 0), and the put is not made.
ANSWER=$(printf 'mod("%s") = "%s"\n\nput %s "%s"\n\n\n' "$LEADER_KEY" "$TENURE" "$1" "$2" |
    etcdctl txn)
case "$ANSWER" in
SUCCESS*) echo "written with term $FENCE_TERM" ;;
*) echo "refused: term $FENCE_TERM no longer leads $ELECTION" >&2; exit 1 ;;
esac
