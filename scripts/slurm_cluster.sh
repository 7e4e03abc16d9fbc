#!/usr/bin/env bash
# A real 4-node Slurm cluster on this one machine, for monarch's tests and demos.
#
# One slurmctld plus one slurmd per node (n1..n4), authenticated by munge. Each node is a host of its
# own, as on a real cluster: its slurmd (and so every task srun starts there) runs in its own network
# namespace with its own address on a private bridge, its own hostname (n1..n4) and its own
# /etc/hosts (n1..n4 -> their addresses), so nothing between the client and a node, or between
# nodes, can take a same-host shortcut:
#
#     bridge mnb<tag>  10.231.N.1/24   root namespace: slurmctld, munged, the client (sbatch, monarch)
#       |-- netns monarch-<tag>-h0  10.231.N.11  slurmd n1
#       ...
#       `-- netns monarch-<tag>-h3  10.231.N.14  slurmd n4
#
# N is the first /24 of 10.231.0.0/16 that no other cluster or reservation on this machine uses, and
# <tag> comes from DIR, so concurrent clusters in different DIRs do not collide; the namespaces are
# made and removed by monarch_schedulers/netns.py (the module behind `monarch serve --netns`), run with any
# python3. Everything else the cluster writes lives under DIR, so a test run can start, use and
# throw away a cluster without touching system config.
#
# Needs root: munged runs as the munge user, slurmd as root, and namespaces need CAP_NET_ADMIN.
# Where namespaces cannot be made, MONARCH_SLURM_NETNS=0 runs every node on 127.0.0.1 instead
# (one network stack: a smoke test of Slurm, not of multi-host; it adds '127.0.0.1 n1 n2 n3 n4'
# to /etc/hosts for tools that reach "the rank-0 node" by name).
#
#   scripts/slurm_cluster.sh install
#   eval "$(scripts/slurm_cluster.sh start)"      # stdout is only the export line
#   sbatch -N4 --wrap 'srun hostname'; squeue
#   scripts/slurm_cluster.sh status
#   scripts/slurm_cluster.sh stop
#
# The first sbatch job after start waits ~3 s for the scheduler's first pass (later ones ~1 s;
# srun allocates at once): poll squeue, don't sleep.
set -euo pipefail
# The daemons live in /usr/sbin, which non-login shells (CI steps, sudo -E, cron) often lack.
export PATH=$PATH:/usr/sbin:/sbin

readonly DEFAULT_DIR=/tmp/monarch-slurm
readonly NODES=(n1 n2 n3 n4)
# Off Slurm's defaults (6817/6818) so a system Slurm, or a second checkout, does not collide.
readonly CTLD_PORT=${MONARCH_SLURMCTLD_PORT:-16817}
readonly SLURMD_PORT=${MONARCH_SLURMD_PORT:-16818}
readonly NODE_PORT=${MONARCH_SLURM_NODE_PORT:-17001} # first of 4 consecutive ports, one per slurmd
# 2 CPUs per node so both `srun -N4 --ntasks-per-node=1` and a few tasks per node fit.
readonly CPUS_PER_NODE=${MONARCH_SLURM_CPUS_PER_NODE:-2}
readonly START_TIMEOUT=${MONARCH_SLURM_START_TIMEOUT:-30}
readonly STOP_TIMEOUT=${MONARCH_SLURM_STOP_TIMEOUT:-15}
readonly MUNGE_PIDFILE=/run/munge/munged.pid
readonly NETNS=${MONARCH_SLURM_NETNS:-1}
readonly SUPERNET=10.231.0.0/16
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT
# netns.py is standard library only; -P keeps monarch_schedulers/ (whose module names are not unique) off sys.path.
netns_py() { "${MONARCH_PYTHON:-python3}" -P "$ROOT/monarch_schedulers/netns.py" "$@"; }

usage() {
    cat >&2 <<EOF
usage: $(basename "$0") COMMAND [DIR]

  install      apt-get install slurm-wlm + munge unless slurmctld is already on PATH
  start [DIR]  make the bridge and one network namespace per node, write DIR/slurm.conf, start
               munged, slurmctld and slurmd n1..n4 (each in its namespace), wait until all nodes
               are idle; prints 'export SLURM_CONF=DIR/slurm.conf' as its last stdout line.
               Does nothing but print that line when the cluster in DIR is already healthy.
  stop [DIR]   cancel jobs, stop every daemon that start started, remove the namespaces, veths
               and bridge; safe to repeat. munged is shared by the machine and kept while a
               cluster in another DIR still runs.
  status [DIR] print each node's address and state and exit 0 if the cluster in DIR is healthy,
               else exit 1

DIR defaults to $DEFAULT_DIR.
Environment: MONARCH_SLURMCTLD_PORT (16817), MONARCH_SLURMD_PORT (16818),
  MONARCH_SLURM_NODE_PORT (17001, first of 4), MONARCH_SLURM_CPUS_PER_NODE (2),
  MONARCH_SLURM_START_TIMEOUT (30 s), MONARCH_SLURM_STOP_TIMEOUT (15 s),
  MONARCH_SLURM_NETNS (1; 0: every node on 127.0.0.1, for machines without namespaces),
  MONARCH_PYTHON (python3: runs monarch_schedulers/netns.py).
EOF
}

log() { echo "slurm_cluster: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# `kill -0` alone would trust a stale pid file whose pid was reused; the name check avoids
# signalling an unrelated process. Zombies count as dead: this machine's PID 1 reaps orphans
# lazily (~1 s), and a daemon that exited lingers as <defunct> until then.
pid_is() { # PID [NAME]
    local stat
    [[ -n $1 ]] && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -z ${2:-} || $stat == "$1 ($2) "* ]] && [[ ${stat##*) } != Z* ]]
}

pid_from() { # PIDFILE
    [[ -r $1 ]] && tr -dc '0-9' <"$1" || true
}

# slurmstepd has no pid file and may outlive a crashed slurmd, and a daemon whose pid file is gone
# is still ours. Every slurm daemon of this cluster (slurmscriptd and slurmstepd too) keeps its log
# under DIR/log open, which finds exactly this DIR's processes and no other cluster's. (An
# environment marker would not do: slurmstepd overwrites its environ with its process title.)
pids_marked() { # DIR [COMM_REGEX]
    local p f
    for p in /proc/[0-9]*; do
        grep -qxE "${2:-slurm[a-z]*}" "$p/comm" 2>/dev/null || continue
        for f in "$p"/fd/*; do
            if [[ "$(readlink "$f" 2>/dev/null)" == "$1"/log/* ]]; then
                echo "${p#/proc/}"
                break
            fi
        done
    done
}

# The daemons of DIR's cluster that are alive, one pid a line.
cluster_pids() { # DIR
    local dir=$1 pid n
    {
        pid=$(pid_from "$dir/slurmctld.pid")
        pid_is "$pid" slurmctld && echo "$pid"
        for n in "${NODES[@]}"; do
            pid=$(pid_from "$dir/slurmd-$n.pid")
            pid_is "$pid" slurmd && echo "$pid"
        done
        pids_marked "$dir"
    } | sort -u
}

# Read the kernel's socket table rather than connect: a probe connection makes slurmctld log
# "Zero Bytes were transmitted or received" every time.
port_open() { # PORT -> is something LISTENing (state 0A) on it
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" { found = 1 } END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# sinfo retries for ~9 s when slurmctld is down, so every query first checks the controller's
# port and is capped by `timeout`.
node_states() { # DIR -> "name state" lines
    local dir=$1
    port_open "$(conf_value "$dir" SlurmctldPort)" || return 1
    SLURM_CONF=$dir/slurm.conf timeout 5 sinfo -h -N -o '%N %T'
}

conf_value() { # DIR KEY
    sed -n "s/^$2=//p" "$1/slurm.conf" 2>/dev/null | head -n1
}

# Healthy = controller up and every node registered and usable. Busy nodes count: a running job
# must not make `start` tear the cluster down.
healthy() { # DIR
    local dir=$1 states n
    [[ -f $dir/slurm.conf ]] || return 1
    pid_is "$(pid_from "$dir/slurmctld.pid")" slurmctld || return 1
    # slurmctld notices a dead slurmd only after SlurmdTimeout (30 s); the pid files know now.
    for n in "${NODES[@]}"; do
        pid_is "$(pid_from "$dir/slurmd-$n.pid")" slurmd || return 1
    done
    pid_is "$(pid_from "$MUNGE_PIDFILE")" munged || return 1
    states=$(node_states "$dir") || return 1
    [[ $(wc -l <<<"$states") -eq ${#NODES[@]} ]] || return 1
    # '*' marks a node that stopped responding; anything else (down, drain, fail...) is unusable.
    ! grep -vqE '^[^ ]+ (idle|allocated|mixed|completing)$' <<<"$states"
}

all_idle() { # DIR
    local states
    states=$(node_states "$1") || return 1
    [[ $(wc -l <<<"$states") -eq ${#NODES[@]} ]] && ! grep -vqE '^[^ ]+ idle$' <<<"$states"
}

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root (munged runs as munge, slurmd as root, and the nodes' network namespaces need it)"; }

cmd_install() {
    if command -v slurmctld >/dev/null 2>&1; then
        return 0
    fi
    need_root
    log "installing slurm-wlm and munge (apt-get, ~20 s)"
    # Quiet unless it fails; then the apt output is the diagnosis.
    local out
    out=$(mktemp)
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; } >"$out" 2>&1; then
        cat "$out" >&2
        rm -f "$out"
        die "apt-get install slurm-wlm munge failed"
    fi
    rm -f "$out"
    command -v slurmctld >/dev/null 2>&1 || die "slurmctld still not on PATH after install"
}

# The namespaces of DIR's cluster are named after it, so stop finds them without any state.
netns_tag() { # DIR
    echo "s$(printf '%s' "$1" | md5sum | cut -c1-7)"
}

write_conf() { # DIR CTLD_ADDR NODE_ADDR...  (no NODE_ADDR: every node on 127.0.0.1)
    local dir=$1 ctld=$2 i last_port=$((NODE_PORT + ${#NODES[@]} - 1))
    shift 2
    local addrs=("$@")
    cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm_cluster.sh; rewritten on every fresh start.
ClusterName=monarch
# The controller's name must be this machine's; the nodes reach it at this address.
SlurmctldHost=$(hostname -s)($ctld)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
# No cgroups in this container: track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
# A node that comes back registers as usable instead of staying DOWN.
ReturnToService=2
SchedulerType=sched/backfill
# Default batch_sched_delay=3 lets an sbatch job sit PENDING up to 3 s before its first scheduling try.
SchedulerParameters=batch_sched_delay=0
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
MailProg=/bin/true
# Trust the CPUs/RealMemory below even where the machine has fewer; otherwise slurmd drains the node.
SlurmdParameters=config_overrides
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    if ((${#addrs[@]} == 0)); then
        echo "NodeName=n[1-${#NODES[@]}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$NODE_PORT-$last_port CPUs=$CPUS_PER_NODE RealMemory=2000 State=UNKNOWN" >>"$dir/slurm.conf"
        return
    fi
    for i in "${!NODES[@]}"; do
        echo "NodeName=${NODES[$i]} NodeHostname=${NODES[$i]} NodeAddr=${addrs[$i]} Port=$((NODE_PORT + i)) CPUs=$CPUS_PER_NODE RealMemory=2000 State=UNKNOWN" >>"$dir/slurm.conf"
    done
}

# Loopback layout only: tools that reach the rank-0 node by its Slurm name (torchrun, TorchX
# dist.ddp) need n1..n4 to resolve. (Namespaced nodes get a private /etc/hosts instead.)
ensure_hosts() {
    local line="127.0.0.1 ${NODES[*]}"
    grep -qxF "$line" /etc/hosts || echo "$line" >>/etc/hosts
}

start_munged() {
    if pid_is "$(pid_from "$MUNGE_PIDFILE")" munged; then
        return 0
    fi
    # The package creates the key; recreate it only if someone removed it.
    if [[ ! -s /etc/munge/munge.key ]]; then
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key >&2
    fi
    # /run is a tmpfs that nothing (no systemd here) prepares for munge.
    mkdir -p /run/munge
    chown munge:munge /run/munge
    # A socket left by a munged killed earlier is fine: munged checks its lock file, not the socket.
    runuser -u munge -- /usr/sbin/munged >&2
}

fail_start() { # DIR MESSAGE
    local dir=$1 f
    log "error: $2"
    for f in "$dir"/log/*.log; do
        [[ -f $f ]] || continue
        echo "---- tail $f" >&2
        # Every slurmd start logs the same missing-PMIx lines; they would push the real cause out.
        grep -vE 'pmix|MPI: Cannot create context' "$f" | tail -n 10 >&2 || true
    done
    if pid_is "$(pid_from "$dir/slurmctld.pid")" slurmctld; then
        echo "---- sinfo" >&2
        node_states "$dir" >&2 || echo "(controller unreachable)" >&2
    fi
    # A half-started cluster would hold the ports and confuse the next start; the logs stay.
    stop_cluster "$dir"
    exit 1
}

cmd_start() { # DIR
    local dir=$1 deadline n i why addrs=() ctld=127.0.0.1
    need_root
    command -v slurmctld >/dev/null 2>&1 || die "slurmctld not on PATH; run '$0 install' first"
    if [[ $NETNS != 0 ]] && ! why=$(netns_py check 2>&1); then
        die "cannot give the nodes network namespaces: ${why:-netns.py check failed} (MONARCH_SLURM_NETNS=0 runs every node on 127.0.0.1 instead)"
    fi
    if healthy "$dir"; then
        echo "export SLURM_CONF=$dir/slurm.conf"
        return 0
    fi
    # Half-up leftovers (a dead slurmd, a stale controller) would confuse the fresh daemons.
    stop_cluster "$dir" keep_munge
    # Fresh state every start: no jobs resurrected from a previous run, job ids from 1.
    rm -rf "$dir/state" "$dir/spool"
    # slurmd logs a socket-dir error unless its spool dir exists before it starts.
    mkdir -p "$dir/state" "$dir/log" "${NODES[@]/#/$dir/spool/}"
    rm -f "$dir/netns.json" "$dir/hosts"
    if [[ $NETNS != 0 ]]; then
        # Prints the bridge's address, then the nodes'.
        read -r -a addrs < <(netns_py create "$(netns_tag "$dir")" "${#NODES[@]}" "$SUPERNET" "$dir/netns.json" 2>"$dir/log/netns.err") || true
        ((${#addrs[@]} == ${#NODES[@]} + 1)) || fail_start "$dir" "network namespaces: $(cat "$dir/log/netns.err")"
        ctld=${addrs[0]}
        addrs=("${addrs[@]:1}")
        netns_py hosts "$dir/netns.json" "${NODES[@]}" >"$dir/hosts" || fail_start "$dir" "cannot write $dir/hosts"
    else
        ensure_hosts
    fi
    write_conf "$dir" "$ctld" "${addrs[@]}"
    start_munged

    # Daemon chatter goes to stderr: stdout is reserved for the export line callers eval.
    slurmctld -f "$dir/slurm.conf" >&2 ||
        fail_start "$dir" "slurmctld failed to start"
    for i in "${!NODES[@]}"; do
        n=${NODES[$i]}
        if [[ $NETNS != 0 ]]; then
            # nsenter, not `ip netns exec` (which remounts /sys: slurmd then finds no cgroup fs and
            # fails); own hostname and /etc/hosts, so tasks see the node they run on.
            netns_py exec "$dir/netns.json" "$i" "$n" "$dir/hosts" -- slurmd -f "$dir/slurm.conf" -N "$n" >&2 ||
                fail_start "$dir" "slurmd -N $n failed to start in its namespace"
        else
            slurmd -f "$dir/slurm.conf" -N "$n" >&2 ||
                fail_start "$dir" "slurmd -N $n failed to start"
        fi
    done

    deadline=$((SECONDS + START_TIMEOUT))
    while :; do
        # A controller that died (port taken, bad config) will not come back: say so now.
        if [[ -f $dir/slurmctld.pid ]] && ! pid_is "$(pid_from "$dir/slurmctld.pid")" slurmctld; then
            fail_start "$dir" "slurmctld exited"
        fi
        all_idle "$dir" && break
        if ((SECONDS >= deadline)); then
            fail_start "$dir" "nodes not all idle after ${START_TIMEOUT}s"
        fi
        sleep 0.1
    done
    echo "export SLURM_CONF=$dir/slurm.conf"
}

other_slurm_alive() {
    local p
    for p in /proc/[0-9]*; do
        grep -qxE 'slurmctld|slurmd' "$p/comm" 2>/dev/null && pid_is "${p#/proc/}" && return 0
    done
    return 1
}

wait_gone() { # TIMEOUT PID...
    local deadline=$((SECONDS + $1)) p alive
    shift
    while :; do
        alive=()
        for p in "$@"; do
            if pid_is "$p"; then alive+=("$p"); fi
        done
        ((${#alive[@]} == 0)) && return 0
        ((SECONDS >= deadline)) && break
        sleep 0.1
    done
    log "SIGKILL after ${STOP_TIMEOUT}s: ${alive[*]}"
    kill -KILL "${alive[@]}" 2>/dev/null || true
}

stop_cluster() { # DIR [keep_munge]
    local dir=$1 pids jobs deadline pid
    # The polite path needs a controller that answers and munged to authenticate to it; without
    # them squeue/scontrol would only retry until their timeouts.
    if [[ -f $dir/slurm.conf ]] && pid_is "$(pid_from "$dir/slurmctld.pid")" slurmctld &&
        pid_is "$(pid_from "$MUNGE_PIDFILE")" munged && port_open "$(conf_value "$dir" SlurmctldPort)"; then
        # Jobs survive `scontrol shutdown` (their slurmstepd keeps running), so cancel them first
        # and let slurmstepd kill the tasks within KillWait.
        jobs=$(SLURM_CONF=$dir/slurm.conf timeout 5 squeue -h -o %A 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086
            SLURM_CONF=$dir/slurm.conf timeout 5 scancel $jobs 2>/dev/null || true
            deadline=$((SECONDS + STOP_TIMEOUT))
            while [[ -n $(pids_marked "$dir" slurmstepd) ]] && ((SECONDS < deadline)); do
                sleep 0.1
            done
        fi
        SLURM_CONF=$dir/slurm.conf timeout 10 scontrol shutdown >/dev/null 2>&1 || true
    fi
    mapfile -t pids < <(cluster_pids "$dir")
    if ((${#pids[@]})); then
        # scontrol shutdown already asked them; SIGTERM covers daemons the controller could not reach.
        kill -TERM "${pids[@]}" 2>/dev/null || true
        wait_gone "$STOP_TIMEOUT" "${pids[@]}"
    fi
    # After the daemons (a slurmd would lose its address under a running job), and by name, so a
    # start that stopped halfway leaves nothing either; skipped where nothing of DIR's is there.
    local tag
    tag=$(netns_tag "$dir")
    if ip netns list 2>/dev/null | grep -q "^monarch-$tag-" || ip -br link 2>/dev/null | grep -qE "^mn[bv]$tag[ @-]"; then
        netns_py remove "$tag" || log "could not remove every namespace of $dir"
    fi
    # munged is one per machine; a cluster in another DIR still needs it.
    if [[ ${2:-} != keep_munge ]] && ! other_slurm_alive; then
        pid=$(pid_from "$MUNGE_PIDFILE")
        if pid_is "$pid" munged; then
            kill -TERM "$pid" 2>/dev/null || true
            wait_gone "$STOP_TIMEOUT" "$pid"
        fi
    fi
    rm -f "$dir/slurmctld.pid" "$dir"/slurmd-*.pid
}

cmd_stop() { # DIR
    need_root
    stop_cluster "$1"
}

cmd_status() { # DIR
    local dir=$1
    if healthy "$dir"; then
        SLURM_CONF=$dir/slurm.conf timeout 5 sinfo -N -o '%N %o %T %P'
        return 0
    fi
    log "no healthy cluster in $dir"
    return 1
}

main() {
    (($# >= 1 && $# <= 2)) || {
        usage
        exit 2
    }
    local cmd=$1 dir=${2:-$DEFAULT_DIR}
    # Relative paths would break the daemons, which chdir away; pid files and sinfo need one spelling.
    [[ $dir == /* ]] || dir=$(pwd)/$dir
    dir=${dir%/}
    case $cmd in
    install) (($# == 1)) || { usage; exit 2; }; cmd_install ;;
    start) mkdir -p "$dir" && cmd_start "$dir" ;;
    stop) cmd_stop "$dir" ;;
    status) cmd_status "$dir" ;;
    -h | --help | help) usage ;;
    *)
        usage
        exit 2
        ;;
    esac
}

main "$@"
