#!/bin/sh
# Container health checks (Docker HEALTHCHECK, compose `healthcheck:`); exit 0 when healthy.
#
#   quotient-healthcheck coordinator ADDRESS CA CERT KEY
#       Asks the coordinator at ADDRESS (e.g. 127.0.0.1:7401) about itself with the
#       certificate CERT/KEY (its own will do: any certificate of the cluster may ask):
#       `quotient cluster health` on it alone, healthy once it is a member of an
#       initialised cluster whose Raft runs.
#   quotient-healthcheck agent [STATE_DIR]
#       Healthy while the agent holds a lease from a leader: the agent rewrites
#       STATE_DIR/agent-lease (default /var/lib/quotient-agent) on every acknowledged
#       heartbeat with when its lease runs out, in ms since boot; unhealthy before its first
#       registration, once the lease ran out, and while it stops its jobs (fencing).
#
# Newer agents and coordinators also answer GET /readyz on --metrics-listen; where that is
# enabled, an HTTP check on it is the simpler choice.
set -eu
role="${1:-}"
[ "$#" -eq 0 ] || shift
case "$role" in
    coordinator)
        [ "$#" -eq 4 ] || { echo "usage: quotient-healthcheck coordinator ADDRESS CA CERT KEY" >&2; exit 2; }
        config="$(mktemp)"
        trap 'rm -f "$config"' EXIT
        printf 'coordinators = ["%s"]\nca = "%s"\ncert = "%s"\nkey = "%s"\n' "$1" "$2" "$3" "$4" >"$config"
        quotient --config "$config" cluster health
        ;;
    agent)
        lease="${1:-/var/lib/quotient-agent}/agent-lease"
        read -r expiry mark <"$lease" || { echo "no lease yet ($lease)" >&2; exit 1; }
        read -r up _ </proc/uptime
        cs="${up#*.}"
        cs="${cs#0}"
        now=$((${up%.*} * 1000 + cs * 10))
        if [ "${mark:-}" = fencing ]; then
            echo "the agent is stopping its jobs: its lease ran out" >&2
            exit 1
        fi
        if [ "$now" -ge "$expiry" ]; then
            echo "the agent's lease ran out $((now - expiry)) ms ago: no leader answers it" >&2
            exit 1
        fi
        echo "lease valid for $((expiry - now)) ms"
        ;;
    *)
        echo "usage: quotient-healthcheck coordinator ADDRESS CA CERT KEY | agent [STATE_DIR]" >&2
        exit 2
        ;;
esac
