#!/bin/sh
# Run a cron job on exactly one host: every host's crontab runs this, only the leader works.
#   */5 * * * *  /usr/local/bin/cron-job.sh /usr/local/bin/reap-old-sessions
# `leaderd status -q` exits 0 only while this node leads (1 follower, 3 daemon unreachable,
# 4 role unknown).
set -eu
ELECTION="${LEADERD_ELECTION:-default}"
if ! leaderd status -q --election "$ELECTION"; then
    exit 0  # not the leader (or no daemon): another host does the work
fi
# The term is the fencing token: hand it to what the job writes to.
LEADERD_TERM=$(curl -sf --unix-socket "${LEADERD_SOCKET:-/run/leaderd/leaderd.sock}" \
    "http://localhost/leader/$ELECTION" | sed -n 's/.*"term":\([0-9]*\).*/\1/p')
export LEADERD_TERM
exec "$@"
