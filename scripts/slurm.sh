#!/usr/bin/env bash
# A private Slurm cluster on this machine, for the slurm tests and local trials: munged, slurmctld and two
# slurmd (nodes n1 and n2, both on 127.0.0.1 with their own ports), 4 fake GPUs per node (gres File=
# symlinks to /dev/null), scheduling without the default sbatch delay.
#
#   eval "$(scripts/slurm.sh start)"   # start (as root), wait until both nodes are idle, print export SLURM_CONF=...
#   scripts/slurm.sh env               # print the export line again
#   scripts/slurm.sh status            # exit 0 when slurmctld answers
#   scripts/slurm.sh stop              # cancel every job, SIGTERM each daemon by its pidfile, SIGKILL after 10 s
#   scripts/slurm.sh stop-controller   # only slurmctld (a fault test); `start` brings it back with its state
#
# Everything (config, munge key and socket, spool, state, logs, pidfiles) lives under
# ${ONES_SLURM_DIR:-/tmp/ones-slurm}. Without Slurm installed, `start` runs `apt-get install -y slurm-wlm
# munge` only as root with ONES_CI_SLURM=1; otherwise it fails and says so. Only the export line goes to
# stdout; messages go to stderr. ONES_SLURM_CTLD_PORT (default 16817) and ONES_SLURM_NODE_PORT (default
# 17001; n2 gets the next) move the ports.
set -euo pipefail

DIR="${ONES_SLURM_DIR:-/tmp/ones-slurm}"
CONF="$DIR/slurm.conf"
CTLD_PORT="${ONES_SLURM_CTLD_PORT:-16817}"
NODE_PORT="${ONES_SLURM_NODE_PORT:-17001}"
NODES=(n1 n2)
GPUS_PER_NODE=4
WAIT_S="${ONES_SLURM_WAIT_S:-30}"

say() { echo "slurm.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# The PID in a pidfile when that process still runs the named program (a recycled PID is not ours).
running_pid() {
  local pidfile="$1" comm="$2" pid
  [ -f "$pidfile" ] || return 1
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = "$comm" ] || return 1
  echo "$pid"
}

install_slurm() {
  if [ "$(id -u)" != 0 ] || [ "${ONES_CI_SLURM:-0}" != 1 ]; then
    die "Slurm is not installed; install slurm-wlm and munge (apt-get install -y slurm-wlm munge), or run this as root with ONES_CI_SLURM=1 to let it install"
  fi
  command -v apt-get >/dev/null 2>&1 || die "Slurm is not installed and there is no apt-get to install slurm-wlm"
  say "installing slurm-wlm and munge with apt-get"
  mkdir -p "$DIR"
  export DEBIAN_FRONTEND=noninteractive
  if ! timeout 300 apt-get install -y -q slurm-wlm munge >>"$DIR/install.log" 2>&1; then
    timeout 300 apt-get update -q >>"$DIR/install.log" 2>&1 || true
    timeout 300 apt-get install -y -q slurm-wlm munge >>"$DIR/install.log" 2>&1 \
      || die "apt-get install slurm-wlm munge failed (see $DIR/install.log)"
  fi
}

write_config() {
  mkdir -p "$DIR/munge" "$DIR/state" "$DIR/log" "$DIR/run" "$DIR/dev"
  chmod 755 "$DIR" "$DIR/munge"
  local n i port=$NODE_PORT
  for n in "${NODES[@]}"; do
    mkdir -p "$DIR/spool/$n"
    for i in $(seq 0 $((GPUS_PER_NODE - 1))); do ln -sfn /dev/null "$DIR/dev/$n-gpu$i"; done
  done
  {
    echo "ClusterName=ones-local"
    echo "SlurmctldHost=localhost"
    echo "SlurmctldPort=$CTLD_PORT"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$DIR/munge/munge.sock"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "GresTypes=gpu"
    echo "SlurmdParameters=config_overrides"
    echo "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "KillWait=10"
    echo "MinJobAge=300"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=30"
    for n in "${NODES[@]}"; do
      echo "NodeName=$n NodeAddr=127.0.0.1 NodeHostname=$n Port=$port CPUs=$GPUS_PER_NODE RealMemory=4000 Gres=gpu:$GPUS_PER_NODE"
      port=$((port + 1))
    done
    echo "PartitionName=gpu Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF"
  {
    echo "AutoDetect=off"
    for n in "${NODES[@]}"; do
      echo "NodeName=$n Name=gpu File=$DIR/dev/$n-gpu[0-$((GPUS_PER_NODE - 1))]"
    done
  } >"$DIR/gres.conf"
  if [ ! -s "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 400 "$DIR/munge/munge.key"
}

controller_answers() { SLURM_CONF="$CONF" timeout 5 scontrol ping 2>/dev/null | grep -q "UP"; }

nodes_idle() {
  local out
  out="$(SLURM_CONF="$CONF" timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null)" || return 1
  [ "$(echo "$out" | grep -cE ' (idle|mix|alloc)$' || true)" = "${#NODES[@]}" ]
}

start() {
  if running_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null && controller_answers; then
    say "already running (config $CONF)"
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || install_slurm
  command -v slurmctld >/dev/null 2>&1 || die "slurm-wlm installed but no slurmctld on PATH"
  [ "$(id -u)" = 0 ] || die "the private cluster runs its daemons as root (SlurmUser=root); run this as root"
  write_config
  if ! running_pid "$DIR/run/munged.pid" munged >/dev/null; then
    munged --socket="$DIR/munge/munge.sock" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/run/munged.pid" \
      --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" --force 2>>"$DIR/log/start.log" \
      || die "munged did not start (see $DIR/log/munged.log)"
  fi
  # Each daemon only when it is not running already (after `stop-controller`, only slurmctld starts).
  if ! running_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
    SLURM_CONF="$CONF" slurmctld -i 2>>"$DIR/log/start.log" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
  fi
  local n
  for n in "${NODES[@]}"; do
    running_pid "$DIR/run/slurmd-$n.pid" slurmd >/dev/null && continue
    SLURM_CONF="$CONF" slurmd -N "$n" 2>>"$DIR/log/start.log" || die "slurmd -N $n did not start (see $DIR/log/slurmd-$n.log)"
  done
  local waited=0
  until nodes_idle; do
    sleep 0.2
    waited=$((waited + 1))
    [ "$waited" -lt $((WAIT_S * 5)) ] || die "nodes not idle after ${WAIT_S}s (see $DIR/log/)"
  done
  say "up: slurmctld on port $CTLD_PORT, nodes ${NODES[*]} with $GPUS_PER_NODE fake GPUs each (config $CONF)"
  echo "export SLURM_CONF=$CONF"
}

stop_pid() {
  local pidfile="$1" comm="$2" pid i
  pid="$(running_pid "$pidfile" "$comm")" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  say "$comm (pid $pid) still running after 10 s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

stop() {
  if controller_answers; then
    SLURM_CONF="$CONF" scancel --quiet --full --partition=gpu 2>/dev/null || true
  fi
  local n
  for n in "${NODES[@]}"; do stop_pid "$DIR/run/slurmd-$n.pid" slurmd; done
  stop_pid "$DIR/run/slurmctld.pid" slurmctld
  stop_pid "$DIR/run/munged.pid" munged
  say "stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  stop-controller) stop_pid "$DIR/run/slurmctld.pid" slurmctld ;;  # a fault test: the nodes and jobs run on
  env) echo "export SLURM_CONF=$CONF" ;;
  status) controller_answers ;;
  *) die "usage: scripts/slurm.sh start|stop|env|status" ;;
esac
