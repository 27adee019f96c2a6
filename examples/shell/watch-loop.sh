#!/bin/sh
# Follow leadership changes with curl alone: a long poll on /watch, one line per change.
# Each answer carries the new revision; asking with it waits for the next change.
set -u
SOCK="${LEADERD_SOCKET:-/run/leaderd/leaderd.sock}"
ELECTION="${LEADERD_ELECTION:-default}"
revision=0  # revisions start at 1: the first answer is the current state
while :; do
    body=$(curl -sf --unix-socket "$SOCK" \
        "http://localhost/watch/$ELECTION?timeout=60&revision=$revision") || {
        revision=0  # daemon not there yet, or restarting: its next answer comes at once
        sleep 1
        continue
    }
    revision=$(printf '%s' "$body" | sed -n 's/.*"revision":\([0-9]*\).*/\1/p')
    role=$(printf '%s' "$body" | sed -n 's/.*"role":"\([a-z]*\)".*/\1/p')
    term=$(printf '%s' "$body" | sed -n 's/.*"term":\([0-9]*\),"lease".*/\1/p')
    echo "revision $revision: $role, term $term"
    [ "$role" = stopped ] && exit 0
done
