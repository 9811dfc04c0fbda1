#!/usr/bin/env bash
# A multi-node SLURM cluster on this one machine, for the `cluster` test tier
# (tests/cluster/test_cluster.py, `make test-cluster`). Follows
# ../shared/notes/slurm-multinode-on-one-host.md: each compute node is a slurmd in its
# own network namespace (own veth, own address) and UTS namespace (own host name);
# slurmctld and a private munged run in this namespace. Root, Debian, no systemd.
#
#   tests/cluster/localcluster.sh up DIR [NODES]   NODES (default 3) nodes scn1..scnN at
#                                                   10.79.0.11.. on bridge scbr0, state in DIR;
#                                                   prints `export SLURM_CONF=DIR/slurm.conf`
#   tests/cluster/localcluster.sh down DIR          stop what `up` started, by pid (never by
#                                                   name), remove the namespaces and host entries
#   tests/cluster/localcluster.sh status DIR        sinfo -N of that cluster
#   tests/cluster/localcluster.sh cut|mend DIR N    take node N's link down / up (fault tests)
#
# What the nodes share: the cores, the memory, the file system (so a staged shard
# written on one node is read on another, as on a cluster's parallel file system) and
# the process table (a test can kill every process of one node by its netns). What
# they do not: addresses, ports and host names. The controller answers on 10.79.0.1;
# ports 6937/6938 and a private munge socket keep it apart from a one-node SLURM
# (tests/slurm/localslurm.sh) on the default ports. Nothing can leave the machine:
# the node namespaces have no default route.
#
# SlurmdTimeout=20 makes a node whose link is cut DOWN after about 30 s (the fault
# tests give the ranks' collectives a shorter timeout, so that they notice first);
# KillWait=30 (a common site value) gives a cancelled step's ranks 30 s after SIGTERM to
# write their records.
set -euo pipefail

usage() { echo "usage: $0 up DIR [NODES] | down DIR | status DIR | cut DIR N | mend DIR N" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
conf=$dir/slurm.conf
SUBNET=10.79.0
BRIDGE=scbr0
HOSTS_TAG="# scalegnn-localcluster $dir"

pid_of() { [ -s "$1" ] && cat "$1" || true; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

stop_pid() {  # stop_pid NAME PIDFILE: SIGTERM, wait up to 10 s, then SIGKILL
    local name=$1 pid
    pid=$(pid_of "$2")
    if alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 20); do alive "$pid" || break; sleep 0.5; done
        if alive "$pid"; then echo "localcluster: $name ($pid) ignored SIGTERM; SIGKILL" >&2; kill -KILL "$pid" || true; fi
    fi
    rm -f "$2"
}

nodes_of() { [ -s "$dir/nodes" ] && cat "$dir/nodes" || true; }

case $cmd in
up)
    nodes=${3:-3}
    if [ "$(id -u)" != 0 ]; then echo "localcluster: must run as root (namespaces, slurmd, munged)" >&2; exit 3; fi
    if ! [[ "$nodes" =~ ^[0-9]+$ ]] || [ "$nodes" -lt 2 ] || [ "$nodes" -gt 8 ]; then
        echo "localcluster: NODES must be 2..8, got '$nodes'" >&2; exit 2
    fi
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        command -v apt-get >/dev/null || { echo "localcluster: install slurm-wlm and munge (no apt-get here)" >&2; exit 3; }
        echo "localcluster: installing slurm-wlm and munge (apt-get, about 30 s)" >&2
        { DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge ||
          { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge; }; } >"$dir/apt.log" 2>&1 ||
            { echo "localcluster: apt-get install slurm-wlm munge failed; see $dir/apt.log" >&2; exit 3; }
    fi
    for tool in ip nsenter unshare; do
        command -v $tool >/dev/null || { echo "localcluster: '$tool' is missing (iproute2 / util-linux)" >&2; exit 3; }
    done
    if alive "$(pid_of "$dir/slurmctld.pid")"; then echo "localcluster: a cluster already runs from $dir" >&2; exit 3; fi
    if ip link show $BRIDGE >/dev/null 2>&1; then
        echo "localcluster: bridge $BRIDGE exists: another cluster runs (tests/cluster/localcluster.sh down ITS_DIR)" >&2
        exit 3
    fi
    mkdir -p "$dir/ctld" "$dir/munge"
    : >"$dir/nodes"
    # The network: a bridge here (the controller's side) and one namespace per node.
    ip link add $BRIDGE type bridge
    ip addr add $SUBNET.1/24 dev $BRIDGE
    ip link set $BRIDGE up
    for i in $(seq 1 "$nodes"); do
        ip netns add scn$i
        ip link add scv$i type veth peer name sc0 netns scn$i
        ip link set scv$i master $BRIDGE
        ip link set scv$i up
        ip -n scn$i addr add $SUBNET.1$i/24 dev sc0
        ip -n scn$i link set sc0 up
        ip -n scn$i link set lo up
        echo "scn$i" >>"$dir/nodes"
    done
    { echo "$HOSTS_TAG"; echo "$SUBNET.1 scctl"; for i in $(seq 1 "$nodes"); do echo "$SUBNET.1$i scn$i"; done
      echo "# end $HOSTS_TAG"; } >>/etc/hosts
    # A private munged: its socket is a file, reachable from every namespace.
    chown munge:munge "$dir/munge"; chmod 0755 "$dir" "$dir/munge"
    runuser -u munge -- /usr/sbin/munged -S "$dir/munge/munge.sock" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
    for _ in $(seq 1 20); do [ -s "$dir/munge/munged.pid" ] && break; sleep 0.2; done
    node_lines=""
    for i in $(seq 1 "$nodes"); do
        node_lines+="NodeName=scn$i NodeAddr=$SUBNET.1$i CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=6000 State=UNKNOWN"$'\n'
    done
    cat >"$conf" <<CONF
ClusterName=scn
MailProg=/bin/true
SlurmctldHost=$(hostname -s)($SUBNET.1)
SlurmctldPort=6937
SlurmdPort=6938
AuthInfo=socket=$dir/munge/munge.sock
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
SlurmdTimeout=20
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
InactiveLimit=0
MinJobAge=300
KillWait=30
Waittime=0
${node_lines}PartitionName=debug Nodes=scn[1-$nodes] Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF=$conf
    slurmctld -f "$conf"
    # Each slurmd enters only its node's network namespace (nsenter, not `ip netns exec`,
    # which remounts /sys and hides the cgroup mounts) and a UTS namespace of its own.
    for i in $(seq 1 "$nodes"); do
        mkdir -p "$dir/spool-scn$i"
        nsenter --net=/run/netns/scn$i unshare --uts sh -c "hostname scn$i && exec slurmd -f '$conf' -N scn$i"
    done
    for _ in $(seq 1 60); do
        states=$(sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ')
        [ "$states" = "idle " ] && break
        sleep 0.5
    done
    if [ "$states" != "idle " ]; then
        echo "localcluster: the nodes are '$states', not all idle, after 30 s; logs in $dir" >&2; exit 4
    fi
    echo "export SLURM_CONF=$conf"
    ;;
down)
    for n in $(nodes_of); do stop_pid "slurmd $n" "$dir/slurmd-$n.pid"; done
    # Ranks a test left behind (a node cut off never got its kill request): every process
    # still in a node's network namespace, by pid.
    for n in $(nodes_of); do
        pids=$(ip netns pids "$n" 2>/dev/null || true)
        [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    done
    stop_pid slurmctld "$dir/slurmctld.pid"
    stop_pid munged "$dir/munge/munged.pid"
    if grep -qF "$HOSTS_TAG" /etc/hosts; then
        # /etc/hosts may be a bind mount: rewrite it in place rather than replace it (sed -i).
        kept=$(awk -v tag="$HOSTS_TAG" '$0 == tag {skip=1; next} $0 == "# end " tag {skip=0; next} !skip' /etc/hosts)
        printf '%s\n' "$kept" >/etc/hosts
    fi
    for n in $(nodes_of); do ip netns del "$n" 2>/dev/null || true; done
    ip link del $BRIDGE 2>/dev/null || true
    rm -f "$dir/nodes"
    ;;
status)
    SLURM_CONF=$conf sinfo -N
    ;;
cut|mend)
    [ $# -eq 3 ] || usage
    ip link set "scv$3" "$([ "$cmd" = cut ] && echo down || echo up)"
    ;;
*)
    usage
    ;;
esac
