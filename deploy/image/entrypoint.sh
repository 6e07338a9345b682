#!/bin/sh
# The image's entrypoint: the first argument picks the role, the rest go to its binary.
#
#   coordinator ARGS...   exec quotient-coordinator ARGS...
#   agent ARGS...         exec quotient-agent ARGS...
#   cli ARGS...           exec quotient ARGS...   (also: quotient ARGS...)
#   sh ARGS...            a shell (busybox in the offline image, dash in the Dockerfile's)
#
# Anything else is an error, so a mistyped role never starts the wrong process.
set -eu
role="${1:-}"
[ "$#" -eq 0 ] || shift
case "$role" in
    coordinator) exec quotient-coordinator "$@" ;;
    agent) exec quotient-agent "$@" ;;
    cli | quotient) exec quotient "$@" ;;
    sh) exec /bin/sh "$@" ;;
    "" | -h | --help | help)
        echo "usage: ROLE [ARGS...]; ROLE is coordinator, agent, cli or sh" >&2
        echo "e.g. docker run --rm IMAGE cli --help" >&2
        [ -n "$role" ] && exit 0
        exit 2
        ;;
    *)
        echo "unknown role '$role': the first argument is coordinator, agent, cli or sh" >&2
        exit 2
        ;;
esac
