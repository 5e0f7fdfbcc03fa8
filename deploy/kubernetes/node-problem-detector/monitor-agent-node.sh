#!/bin/sh
# Node Problem Detector custom plugin: is this node left out of a training run?
#
# The sidecar whose node a run's leader left out (a hard GPU error, a second incident on
# the node within the hour: docs/actions.md, "Healing") writes its drain state to
# $MONITOR_AGENT_NODE_FILE (the sidecar's cluster.drain.state_file, on a hostPath both
# mount). NPD's custom-plugin protocol: exit 0 = OK, 1 = the problem (the node condition
# turns True, with the first line printed as its message), 2 = unknown.
state="${MONITOR_AGENT_NODE_FILE:-/var/run/monitor-agent/node.json}"
if [ ! -e "$state" ]; then
    echo "no training run left this node out"
    exit 0
fi
body=$(cat "$state" 2>/dev/null) || { echo "cannot read $state"; exit 2; }
case "$body" in
    *'"drained": true'*|*'"drained":true'*)
        reason=$(printf '%s' "$body" | sed -n 's/.*"reason": *"\([^"]*\)".*/\1/p')
        echo "left out: ${reason:-see the sidecar's GET /v1/node}"
        exit 1 ;;
    *)
        echo "unexpected content in $state"
        exit 2 ;;
esac
