#!/usr/bin/env bash
# Install and start a one-node Slurm cluster on localhost for the test suite: munge, slurmctld and slurmd on a
# node of 2 CPUs, jobs run as root. Idempotent, and returns at once when the node already answers.
# Exit status: 0 ready, 10 the packages could not be installed (apt unreachable), 1 anything else.
set -euo pipefail

MARK="# written by scale tests/slurm/start_cluster.sh"
CONF=/etc/slurm/slurm.conf
SPOOL=/var/spool/scale-slurm
LOGS=/var/log/scale-slurm

node_ready() {
    sinfo -h -n localhost -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)'
}

# the configuration this script maintains
NEW_CONF=$(cat <<EOF
$MARK
ClusterName=scaletest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job may start again after cred_expire seconds (default 120): short, so requeue tests are quick
AuthInfo=cred_expire=10
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=/run/scale-slurmctld.pid
SlurmdPidFile=/run/scale-slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# a requeued job waits for its begin time (cred_expire), then for the main scheduling loop, which tests the pending
# jobs every sched_interval seconds (default 60; backfill, every 30 s, started most first): every second here
SchedulerParameters=sched_interval=1
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# finished jobs stay visible to scontrol (and so to scale status) for 10 minutes
MinJobAge=600
KillWait=5
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
)

if [ -e "$CONF" ] && [ "$(cat "$CONF")" = "$NEW_CONF" ] && command -v sinfo >/dev/null && node_ready; then
    exit 0
fi

install_packages() {
    export DEBIAN_FRONTEND=noninteractive
    # try the cached package lists first; refresh them only when that fails (fresh machine, stale lists)
    apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 && return 0
    apt-get update -q && apt-get install -y -q slurm-wlm munge
}

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    install_packages || { echo "start_cluster.sh: apt-get could not install slurm-wlm and munge" >&2; exit 10; }
fi

# munge: a key, then the daemon under its own user
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# slurm.conf: ours, or none yet (never overwrite a real cluster's configuration)
if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    echo "start_cluster.sh: $CONF exists and was not written by this script; not touching it" >&2
    exit 1
fi
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_daemon() {
    pid_alive "$1" || return 0
    kill "$(cat "$1")"
    for _ in $(seq 100); do pid_alive "$1" || return 0; sleep 0.1; done
    echo "start_cluster.sh: the daemon of $1 did not stop" >&2
    exit 1
}
mkdir -p /etc/slurm "$SPOOL/ctld" "$SPOOL/d" "$LOGS"
if [ ! -e "$CONF" ] || [ "$(cat "$CONF")" != "$NEW_CONF" ]; then
    printf '%s\n' "$NEW_CONF" > "$CONF"
    # a changed configuration needs fresh daemons
    stop_daemon /run/scale-slurmd.pid
    stop_daemon /run/scale-slurmctld.pid
fi

pid_alive /run/scale-slurmctld.pid || slurmctld
pid_alive /run/scale-slurmd.pid || slurmd

for _ in $(seq 100); do
    if node_ready; then exit 0; fi
    # a node left down or drained by an earlier run comes back
    if sinfo -h -n localhost -o %T 2>/dev/null | grep -qE '^(down|drain)'; then
        scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
    fi
    sleep 0.2
done
echo "start_cluster.sh: the Slurm node did not become ready; see $LOGS/slurmctld.log and $LOGS/slurmd.log" >&2
sinfo >&2 || true
exit 1
