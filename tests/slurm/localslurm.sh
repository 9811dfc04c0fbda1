#!/usr/bin/env bash
# A one-node SLURM cluster (slurmctld + slurmd + munge) on this machine, for the
# `slurm` test tier (tests/harness/test_slurm.py, `make test-slurm`) and for trying a sweep on
# a real scheduler (`--cluster localslurm`). Follows ../shared/notes/slurm-on-one-host.md:
# root, Debian, no systemd, no cgroups (CPU and memory requests are bookkeeping only).
#
#   tests/slurm/localslurm.sh up DIR     install slurm-wlm + munge if missing (apt-get),
#                                        start munged (unless one already answers) and
#                                        slurmctld + slurmd with DIR/slurm.conf; state,
#                                        spool, pid and log files all in DIR. Prints
#                                        `export SLURM_CONF=DIR/slurm.conf`: every SLURM
#                                        client (sbatch, squeue, scancel, submitit) needs it.
#   tests/slurm/localslurm.sh down DIR   stop what `up` started, by pid (never by name)
#   tests/slurm/localslurm.sh status DIR sinfo of that cluster
#
# The node declares 8 CPUs whatever the machine has (SlurmdParameters=config_overrides),
# so that jobs of up to 8 one-CPU ranks fit on a 2-core box. A requeued job waits 120 s
# (BeginTime) unless `scontrol update JobId=<id> StartTime=now` is run while it is PENDING.
set -euo pipefail

usage() { echo "usage: $0 up|down|status DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
conf=$dir/slurm.conf

pid_of() { [ -s "$1" ] && cat "$1" || true; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

stop_pid() {  # stop_pid NAME PIDFILE: SIGTERM, wait up to 15 s, then SIGKILL
    local name=$1 pid
    pid=$(pid_of "$2")
    if alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 30); do alive "$pid" || break; sleep 0.5; done
        if alive "$pid"; then echo "localslurm: $name ($pid) ignored SIGTERM; SIGKILL" >&2; kill -KILL "$pid" || true; fi
        echo "localslurm: stopped $name ($pid)" >&2
    fi
    rm -f "$2"
}

case $cmd in
up)
    if [ "$(id -u)" != 0 ]; then echo "localslurm: must run as root (starts slurmd and munged)" >&2; exit 3; fi
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        if ! command -v apt-get >/dev/null; then
            echo "localslurm: slurm-wlm and munge are not installed and there is no apt-get; install them" >&2; exit 3
        fi
        echo "localslurm: installing slurm-wlm and munge (apt-get, about 30 s)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$dir/apt.log" 2>&1 || {
            DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$dir/apt.log" 2>&1
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >>"$dir/apt.log" 2>&1 || {
                echo "localslurm: apt-get install slurm-wlm munge failed; see $dir/apt.log" >&2; exit 3; }
        }
    fi
    # munge: one per host (/run/munge); started here only if none answers, and then
    # remembered in DIR/munged.pid so that `down` stops exactly that one.
    if ! (munge -n 2>/dev/null | unmunge >/dev/null 2>&1); then
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown munge:munge /run/munge /var/log/munge /var/lib/munge
        chmod 0755 /run/munge
        runuser -u munge -- /usr/sbin/munged
        for _ in $(seq 1 20); do [ -s /run/munge/munged.pid ] && break; sleep 0.2; done
        cp /run/munge/munged.pid "$dir/munged.pid"
        munge -n | unmunge | grep -q 'STATUS: *Success' || { echo "localslurm: munge does not work" >&2; exit 3; }
    fi
    if alive "$(pid_of "$dir/slurmctld.pid")"; then
        echo "localslurm: a cluster already runs from $dir" >&2
    else
        host=$(hostname -s)
        mkdir -p "$dir/ctld" "$dir/d"
        cat >"$conf" <<CONF
ClusterName=local
MailProg=/bin/true
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
InactiveLimit=0
MinJobAge=300
KillWait=30
Waittime=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=20000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
        export SLURM_CONF=$conf
        slurmctld -f "$conf"
        slurmd -f "$conf"
        for _ in $(seq 1 60); do
            state=$(sinfo -h -o %T 2>/dev/null || true)
            [ "$state" = idle ] && break
            sleep 0.5
        done
        if [ "$state" != idle ]; then
            echo "localslurm: the node is '$state', not idle, after 30 s; logs: $dir/slurmctld.log $dir/slurmd.log" >&2
            exit 4
        fi
    fi
    echo "export SLURM_CONF=$conf"
    ;;
down)
    stop_pid slurmd "$dir/slurmd.pid"
    stop_pid slurmctld "$dir/slurmctld.pid"
    stop_pid munged "$dir/munged.pid"  # only if `up` started it
    ;;
status)
    SLURM_CONF=$conf sinfo
    ;;
*)
    usage
    ;;
esac
