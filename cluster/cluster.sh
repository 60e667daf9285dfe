#!/usr/bin/env bash
# A three-node Restate cluster on loopback, configured by cluster/cluster.toml.
#
#   cluster/cluster.sh start [N...]   start nodes (default 1 2 3) and wait until the cluster serves
#   cluster/cluster.sh stop  [N...]   SIGTERM, then SIGKILL after 30 s (default: all running nodes)
#   cluster/cluster.sh kill  N...     SIGKILL at once (a crash)
#   cluster/cluster.sh status         which nodes run, with PID and URLs
#   cluster/cluster.sh config N       the merged configuration node N would run with
#
# Environment: CLUSTER_DIR (data, logs and PID files; default cluster/.data), CLUSTER_PORT_BASE
# (default 41000: node N listens on BASE+10+N for the fabric, BASE+70+N admin, BASE+80+N ingress),
# RESTATE_SERVER_BIN (default: the native binary npm installed), CLUSTER_READY_TIMEOUT (s, default 90).
# Everything binds 127.0.0.1. Node 1 provisions the cluster on its first start; data survives restarts.
# A node is only ever signalled through the PID in its PID file, after checking that PID is still
# that node (its command line names the node's data dir).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
dir=${CLUSTER_DIR:-$here/.data}
base=${CLUSTER_PORT_BASE:-41000}
ready_timeout=${CLUSTER_READY_TIMEOUT:-90}
case "$(uname -m)" in x86_64 | amd64) arch=x64 ;; aarch64 | arm64) arch=arm64 ;; *) arch=unknown ;; esac
os=$(uname -s | tr '[:upper:]' '[:lower:]')
bin=${RESTATE_SERVER_BIN:-$repo/node_modules/@restatedev/restate-server-$os-$arch/bin/restate-server}

fabric() { echo "127.0.0.1:$((base + 10 + $1))"; }
admin() { echo "127.0.0.1:$((base + 70 + $1))"; }
ingress() { echo "127.0.0.1:$((base + 80 + $1))"; }
pidfile() { echo "$dir/n$1.pid"; }

die() {
  echo "cluster: $*" >&2
  exit 1
}

# The node's PID if it is running (and is really that node), else nothing.
running_pid() {
  local pid
  pid=$(cat "$(pidfile "$1")" 2>/dev/null) || return 0
  if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--base-dir $dir/n$1 "; then
    echo "$pid"
  fi
}

# Sets node_env to the per-node overrides of cluster.toml for node $1.
set_node_env() {
  local i=$1
  node_env=(
    RESTATE_NODE_NAME="n$i"
    RESTATE_BIND_ADDRESS="$(fabric "$i")"
    RESTATE_ADVERTISED_ADDRESS="http://$(fabric "$i")/"
    RESTATE_ADMIN__BIND_ADDRESS="$(admin "$i")"
    RESTATE_INGRESS__BIND_ADDRESS="$(ingress "$i")"
    RESTATE_METADATA_CLIENT__ADDRESSES="[\"http://$(fabric 1)/\",\"http://$(fabric 2)/\",\"http://$(fabric 3)/\"]"
    RESTATE_AUTO_PROVISION="$([ "$i" = 1 ] && echo true || echo false)"
  )
}

http_ok() { curl -sf -o /dev/null --max-time 2 "$@"; }

# Ready = every started node's ingress is healthy and its admin API answers a query over the
# partitions' tables, which it does only once every partition has a leader (observed: health turns
# 200 seconds earlier). Before provisioning the ports accept connections but never answer.
wait_ready() {
  local deadline=$((SECONDS + ready_timeout)) i
  for i in "$@"; do
    until http_ok "http://$(ingress "$i")/restate/health" &&
      http_ok -X POST "http://$(admin "$i")/query" -H 'content-type: application/json' \
        -H 'accept: application/json' -d '{"query":"select count(*) as n from sys_invocation_status"}'; do
      [ -n "$(running_pid "$i")" ] || die "n$i exited during startup; see $dir/n$i.log"
      [ "$SECONDS" -lt "$deadline" ] || die "n$i not ready after ${ready_timeout}s; see $dir/n$i.log"
      sleep 0.5
    done
  done
}

start() {
  [ -x "$bin" ] || die "restate-server not found at $bin (run scripts/bootstrap, or set RESTATE_SERVER_BIN)"
  mkdir -p "$dir"
  local i
  for i in "$@"; do
    if [ -n "$(running_pid "$i")" ]; then
      echo "n$i already running (pid $(running_pid "$i"))"
      continue
    fi
    mkdir -p "$dir/n$i"
    # setsid: the node gets its own session, so a Ctrl-C in this shell does not reach it.
    set_node_env "$i"
    env "${node_env[@]}" setsid "$bin" --config-file "$here/cluster.toml" --base-dir "$dir/n$i" --no-logo \
      </dev/null >>"$dir/n$i.log" 2>&1 &
    echo $! >"$(pidfile "$i")"
    echo "n$i pid $! admin http://$(admin "$i") ingress http://$(ingress "$i")"
  done
  wait_ready "$@"
  echo "cluster ready"
}

stop() {
  local i pid
  for i in "$@"; do
    pid=$(running_pid "$i")
    if [ -z "$pid" ]; then
      rm -f "$(pidfile "$i")"
      continue
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do
      [ -n "$(running_pid "$i")" ] || break
      sleep 0.2
    done
    if [ -n "$(running_pid "$i")" ]; then kill -KILL "$pid"; fi
    rm -f "$(pidfile "$i")"
    echo "n$i stopped"
  done
}

crash() {
  local i pid
  for i in "$@"; do
    pid=$(running_pid "$i")
    if [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; then echo "n$i killed (pid $pid)"; fi
    rm -f "$(pidfile "$i")"
  done
}

cmd=${1:-}
shift || true
nodes=("$@")
[ ${#nodes[@]} -gt 0 ] || nodes=(1 2 3)
for i in "${nodes[@]}"; do [[ "$i" =~ ^[123]$ ]] || die "nodes are 1, 2 and 3, not '$i'"; done
case "$cmd" in
  start) start "${nodes[@]}" ;;
  stop) stop "${nodes[@]}" ;;
  kill) [ $# -gt 0 ] || die "kill needs node numbers"; crash "${nodes[@]}" ;;
  status)
    for i in 1 2 3; do
      pid=$(running_pid "$i")
      state="stopped"
      [ -z "$pid" ] || state="running pid $pid"
      echo "n$i $state admin http://$(admin "$i") ingress http://$(ingress "$i")"
    done
    ;;
  config)
    set_node_env "${nodes[0]}"
    env "${node_env[@]}" "$bin" --config-file "$here/cluster.toml" --base-dir "$dir/n${nodes[0]}" --dump-config
    ;;
  *) die "usage: cluster/cluster.sh start|stop|kill|status|config [1 2 3]" ;;
esac
