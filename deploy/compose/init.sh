#!/bin/sh
# The compose file's `init` service: `quotient cluster init` on coord-1 once the coordinators
# answer. Idempotent: a cluster already initialised (a later `up`) is left as it is.
set -eu
export QUOTIENT_CONFIG=/admin/client.toml
deadline=$(($(date +%s) + ${QUOTIENT_INIT_TIMEOUT_S:-120}))
while :; do
    # Asks each coordinator about itself: once one names a cluster, it is initialised.
    health="$(quotient -o json cluster health 2>&1 || true)"
    if printf '%s\n' "$health" | grep -Eq '"cluster_id": "[0-9a-f]{32}"'; then
        id="$(printf '%s\n' "$health" | grep -Eo '"cluster_id": "[0-9a-f]{32}"' | head -n1 | cut -d'"' -f4)"
        echo "the cluster is initialised: cluster_id = \"$id\""
        exit 0
    fi
    if out="$(quotient cluster init --coordinator coord-1:7401 2>&1)"; then
        printf '%s\n' "$out"
        exit 0
    fi
    case "$out" in
        *"already belongs to cluster"* | *"already holds Raft state"*)
            echo "already initialised: $out"
            exit 0
            ;;
    esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "could not initialise the cluster: $out" >&2
        echo "$health" >&2
        exit 1
    fi
    echo "waiting for the coordinators: $out"
    sleep 1
done
