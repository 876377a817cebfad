#!/usr/bin/env bash
# A private Docker engine that leaves the host network alone, for the docker tests and local trials.
#
#   eval "$(scripts/dockerd.sh start)"   # start (as root), wait until it answers, print export DOCKER_HOST=...
#   scripts/dockerd.sh env               # print the export line again
#   scripts/dockerd.sh status            # exit 0 when it runs
#   scripts/dockerd.sh stop              # SIGTERM by the PID in the pidfile, wait, SIGKILL after 30 s
#
# dockerd always starts with --bridge=none --iptables=false --ip-forward=false --ip-masq=false: started
# plainly it creates docker0, rewrites iptables and turns on ip_forward, and all of that outlives it.
# Containers then need network_mode "none" (the launcher's default). Socket, data, exec root, pidfile and
# log live under ${ONES_DOCKERD_DIR:-/tmp/ones-dockerd}. Without dockerd installed, `start` runs
# `apt-get install -y docker.io` only as root with ONES_CI_DOCKER=1; otherwise it fails and says so.
# Only the export line goes to stdout; messages go to stderr.
set -euo pipefail

DIR="${ONES_DOCKERD_DIR:-/tmp/ones-dockerd}"
SOCK="$DIR/docker.sock"
PIDFILE="$DIR/dockerd.pid"
LOG="$DIR/dockerd.log"
WAIT_S="${ONES_DOCKERD_WAIT_S:-30}"
NO_NETWORK_FLAGS=(--bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false)

say() { echo "dockerd.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# The PID in the pidfile when that process is still a dockerd (a recycled PID is not ours to kill).
running_pid() {
  local pid
  [ -f "$PIDFILE" ] || return 1
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = dockerd ] || return 1
  echo "$pid"
}

answers() {
  if command -v docker >/dev/null 2>&1; then
    docker -H "unix://$SOCK" version --format '{{.Server.Version}}' >/dev/null 2>&1
  else
    curl -fsS --unix-socket "$SOCK" http://localhost/_ping >/dev/null 2>&1
  fi
}

install_docker() {
  if [ "$(id -u)" != 0 ] || [ "${ONES_CI_DOCKER:-0}" != 1 ]; then
    die "dockerd is not installed; install docker.io (apt-get install -y docker.io), or run this as root with ONES_CI_DOCKER=1 to let it install"
  fi
  command -v apt-get >/dev/null 2>&1 || die "dockerd is not installed and there is no apt-get to install docker.io"
  say "installing docker.io with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! timeout 300 apt-get install -y -q docker.io >>"$LOG" 2>&1; then
    timeout 300 apt-get update -q >>"$LOG" 2>&1 || true
    timeout 300 apt-get install -y -q docker.io >>"$LOG" 2>&1 || die "apt-get install docker.io failed (see $LOG)"
  fi
  command -v dockerd >/dev/null 2>&1 || die "docker.io installed but no dockerd on PATH"
}

start() {
  if pid="$(running_pid)"; then
    answers || die "dockerd (PID $pid) runs but does not answer on $SOCK; see $LOG"
    say "already running (PID $pid)"
    echo "export DOCKER_HOST=unix://$SOCK"
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "dockerd needs root (run as root, or use a Docker engine you already have via DOCKER_HOST)"
  mkdir -p "$DIR/data" "$DIR/exec"
  command -v dockerd >/dev/null 2>&1 || install_docker
  rm -f "$PIDFILE" "$SOCK"
  # setsid: its own session, so a terminal's Ctrl-C does not reach it; `stop` ends it by PID.
  setsid dockerd --host "unix://$SOCK" --data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$PIDFILE" \
    "${NO_NETWORK_FLAGS[@]}" </dev/null >>"$LOG" 2>&1 &
  local pid=$! waited=0
  until answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 15 "$LOG" >&2 || true
      die "dockerd exited during start-up (log: $LOG)"
    fi
    if [ "$waited" -ge $((WAIT_S * 10)) ]; then
      kill -TERM "$pid" 2>/dev/null || true
      die "dockerd did not answer on $SOCK within ${WAIT_S} s (log: $LOG); stopped it"
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  [ -f "$PIDFILE" ] || echo "$pid" >"$PIDFILE"
  say "dockerd $(dockerd --version | cut -d' ' -f3 | tr -d ,) running (PID $pid), socket $SOCK, no host networking"
  echo "export DOCKER_HOST=unix://$SOCK"
}

stop() {
  local pid children waited=0
  if ! pid="$(running_pid)"; then
    say "not running"
    rm -f "$PIDFILE"
    return 0
  fi
  children="$(pgrep -P "$pid" 2>/dev/null || true)"  # its managed containerd
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge 300 ]; then
      say "dockerd (PID $pid) still running 30 s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  for child in $children; do
    if kill -0 "$child" 2>/dev/null; then
      sleep 2
      kill -0 "$child" 2>/dev/null && { say "stopping leftover child $child"; kill -TERM "$child" 2>/dev/null || true; }
    fi
  done
  rm -f "$PIDFILE"
  say "stopped (PID $pid)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "export DOCKER_HOST=unix://$SOCK" ;;
  status) if pid="$(running_pid)" && answers; then say "running (PID $pid)"; else say "not running"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|env|status" >&2; exit 2 ;;
esac
