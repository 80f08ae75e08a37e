#!/usr/bin/env bash
# The test cluster: a Slurm 22.05 cluster of 1 to 64 nodes simulated on this
# machine, for the tests of distkernel's Slurm launcher (CI has no cluster).
#
#   tests/slurm/cluster.sh up [N]        start it (N nodes, default 2); prints the
#                                        client's environment (SLURM_CONF=...) and,
#                                        on its last line, "started" or "reused"
#   tests/slurm/cluster.sh down          stop everything it started, remove all it made
#   tests/slurm/cluster.sh kill nodeI    crash a node: SIGKILL every process in it
#                                        (slurmd, steps, tasks) and drop its network
#   tests/slurm/cluster.sh start nodeI   boot a crashed node again
#   tests/slurm/cluster.sh exec nodeI CMD...   run CMD inside a node
#   tests/slurm/cluster.sh pids nodeI    the processes living in a node
#   tests/slurm/cluster.sh leftovers     print what a cluster left on the machine
#                                        (processes, links, state); exit 1 if any
#
# How it is built. Each host is a network + UTS + mount namespace held open by
# a `sleep infinity` whose argv[0] names it; hosts share the one filesystem:
#
#   this namespace ("login")  bridge $BR, $NET.1      sinfo, salloc, a kernel
#   ctl                       $NET.2                  slurmctld
#   nodeI                     $NET.(10+I)             slurmd -N nodeI
#
# Each host's end of the bridge is a veth named $BR-ctl, $BR-n1 ... $BR-n64: a
# link's name has at most 15 characters, and a 9-character bridge name leaves 5.
#   munged                    this namespace, its own key and socket in $DIR
#
# Why it is built so (../shared/slurm-sim/README.md has the findings):
# - every per-node path in slurm.conf is keyed by %n: all nodes share one
#   filesystem, and a slurmd kills the process named in its pid file;
# - SlurmdParameters=config_overrides: nodes report the configured CPUs, not the
#   shared machine's, so 2 real cores can hold 2 nodes x 2 tasks;
# - no cgroups (proctrack/linuxproc, task/none): Slurm 22.05 puts every job at
#   /slurm/uid_X/job_Y, which two simulated nodes of one job would share;
# - ReturnToService=2: a crashed node that boots again is idle at once;
# - a FUTURE node named after this host: Slurm 22.05.8 (Debian 12) sends
#   srun's step messages (node failure, step complete) to the address of the
#   node srun runs on, and an srun on a host that is no node never hears them
#   and hangs after a node loss (Slurm bug 16401, fixed in 22.05.9). FUTURE
#   nodes are never scheduled nor contacted;
# - every process is recorded with its start time (field 22 of /proc/PID/stat),
#   so a pid reused by a stranger is never signalled, and teardown kills only
#   what lives in our namespaces plus our munged.
#
# Environment (all optional):
#   DISTKERNEL_SLURM_SIM_DIR     state folder (default /tmp/distkernel-slurm)
#   DISTKERNEL_SLURM_SIM_NET     first three octets of its /24 (default 10.79.0)
#   DISTKERNEL_SLURM_SIM_BRIDGE  the bridge's name (default dkslurm0)
#   DISTKERNEL_SLURM_SIM_CPUS    CPUs each node reports (default 2, at most 256; may exceed
#                                the real ones: 16 nodes of 16 hold a 256-rank run)
#   DISTKERNEL_SLURM_SIM_SRUN_WORKAROUND  1 (default): the FUTURE node for bug 16401
#                                (above); 0: leave it out, so srun behaves as on a site
#                                whose login host is no node, and hangs after a node loss
#   DISTKERNEL_SLURM_SIM_GPUS    "GPUs" each node has (default 2; 0: none), as GRES gpu
#                                on device files $DIR/dev/nodeI/nvidiaK with no driver
#                                behind: Slurm counts them and hands them out
#                                (CUDA_VISIBLE_DEVICES); the ranks use the fake libcudart
#   DISTKERNEL_SLURM_SIM_GPU_TYPE  the GPUs' GRES type (default h200: Gres=gpu:h200:N,
#                                as most sites name theirs; "none": untyped, gpu:N)
#   DISTKERNEL_SLURM_SIM_SELECT  what the nodes hand out: CR_CPU (default: CPUs only) or
#                                CR_CPU_Memory (memory too, as many sites do: each node
#                                has RealMemory=2048 MB and DefMemPerCPU is left unset,
#                                so a job or step that asks no memory gets all of its
#                                node's, and the next one on that node waits)
# Two clusters on one machine need all three of folder, network and bridge apart.
#
# Partitions: `sim` (the default, every node) and `stuck` (every node, State=DOWN:
# it queues jobs and never runs them, reason PartitionDown), for the tests of a
# request that waits; `short` (every node, MaxTime=5 minutes, DefaultTime=1),
# for the tests of a time limit longer than a partition allows.
set -euo pipefail

DIR=${DISTKERNEL_SLURM_SIM_DIR:-/tmp/distkernel-slurm}
NET=${DISTKERNEL_SLURM_SIM_NET:-10.79.0}
BR=${DISTKERNEL_SLURM_SIM_BRIDGE:-dkslurm0}
CPUS=${DISTKERNEL_SLURM_SIM_CPUS:-2}
WORKAROUND=${DISTKERNEL_SLURM_SIM_SRUN_WORKAROUND:-1}
GPUS=${DISTKERNEL_SLURM_SIM_GPUS:-2}
SELECT=${DISTKERNEL_SLURM_SIM_SELECT:-CR_CPU}
GPU_TYPE=${DISTKERNEL_SLURM_SIM_GPU_TYPE:-h200}
CONF=$DIR/etc/slurm.conf
MARK=distkernel-slurm-host:$DIR:   # argv[0] prefix of our namespace holders
PREFIX=$BR-                         # our veth ends: dkslurm0-ctl, dkslurm0-node1, ...

die() { echo "cluster.sh: $*" >&2; exit 1; }
note() { echo "cluster.sh: $*" >&2; }

case $DIR in /*) ;; *) die "DISTKERNEL_SLURM_SIM_DIR must be an absolute path, got '$DIR'" ;; esac
[[ $NET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "DISTKERNEL_SLURM_SIM_NET must look like 10.79.0, got '$NET'"
[[ $WORKAROUND =~ ^[01]$ ]] || die "DISTKERNEL_SLURM_SIM_SRUN_WORKAROUND must be 0 or 1, got '$WORKAROUND'"
[[ $CPUS =~ ^[1-9][0-9]{0,2}$ ]] && ((CPUS <= 256)) || die "DISTKERNEL_SLURM_SIM_CPUS must be 1 to 256, got '$CPUS'"
[[ $GPUS =~ ^[0-8]$ ]] || die "DISTKERNEL_SLURM_SIM_GPUS must be 0 to 8, got '$GPUS'"
[[ $GPU_TYPE =~ ^[a-z][a-z0-9_]{0,19}$ ]] || die "DISTKERNEL_SLURM_SIM_GPU_TYPE must be a GRES type such as h200 (1 to 20 lower-case letters, digits, _) or none, got '$GPU_TYPE'"
[[ $SELECT =~ ^CR_CPU(_Memory)?$ ]] || die "DISTKERNEL_SLURM_SIM_SELECT must be CR_CPU or CR_CPU_Memory, got '$SELECT'"
[[ $BR =~ ^[a-z][a-z0-9]{0,8}$ ]] || die "DISTKERNEL_SLURM_SIM_BRIDGE must be 1 to 9 letters and digits, got '$BR'"

# ---------------------------------------------------------------- bookkeeping

start_time() {   # PID -> its start time in clock ticks since boot
    local stat
    # read, not $(< ...): under set -e a process that exits between the caller's
    # look and this read would end the script (bash exits on a failed $(< FILE))
    { read -r stat < "/proc/$1/stat"; } 2> /dev/null || return 1
    stat=${stat##*) }            # the name may hold spaces and parentheses
    set -- $stat
    echo "${20}"
}

remember() {     # NAME PID: record PID with its start time
    local t
    t=$(start_time "$2") || die "$1 (pid $2) exited at once"
    echo "$2 $t" > "$DIR/pids/$1"
}

recorded() {     # NAME -> the pid, if that very process still runs
    local pid t
    [[ -r $DIR/pids/$1 ]] || return 1
    read -r pid t < "$DIR/pids/$1"
    [[ -n $pid && $(start_time "$pid" 2>/dev/null) == "$t" ]] || return 1
    echo "$pid"
}

netns_of() { stat -L -c %i "/proc/$1/ns/net" 2>/dev/null; }

in_netns() {     # INODE... -> every pid whose network namespace is one of them
    (($#)) || return 0
    # a process may exit between the glob and its stat: not an error
    { stat -L -c '%i %n' /proc/[0-9]*/ns/net 2> /dev/null || true; } |
        awk -v want="$*" 'BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) ns[w[i]] = 1 }
                          ($1 in ns) { split($2, p, "/"); print p[3] }'
}

holders() {      # the pids of our namespace holders: recorded, or found by their mark
    local f pid a0
    for f in "$DIR"/pids/host-*; do
        [[ -e $f ]] && pid=$(recorded "$(basename "$f")") && echo "$pid"
    done
    for f in /proc/[0-9]*/cmdline; do
        a0=""
        IFS= read -r -d '' a0 2> /dev/null < "$f" || true
        [[ $a0 == "$MARK"* ]] && { pid=${f#/proc/}; echo "${pid%/cmdline}"; }
    done
    return 0
}

running() {      # PID: it exists and is not a zombie waiting to be reaped
    local stat
    { read -r stat < "/proc/$1/stat"; } 2> /dev/null || return 1   # as in start_time
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

# kill_all PID...: SIGKILL, and wait (up to 5 s) until they are gone. Not SIGTERM
# first: the daemons take seconds to save state that is deleted right after, and
# nothing of theirs outlives the cluster.
kill_all() {
    local p k left
    (($#)) || return 0
    kill -KILL "$@" 2> /dev/null || true
    for ((k = 0; k < 250; k++)); do
        left=0
        for p in "$@"; do running "$p" && left=1 && break; done
        ((left)) || return 0
        sleep 0.02
    done
    note "still running after SIGKILL: $*"
}

# ---------------------------------------------------------------- hosts

# host_up NAME ADDR: a namespace with hostname NAME, our /etc/hosts, eth0 = ADDR
# on the bridge.
host_up() {
    local name=$1 addr=$2 pid k
    rm -f "$DIR/run/$name.ready"
    # setsid: out of the caller's process group (a ^C to the tests is not a crash);
    # unshare without --fork and bash's exec keep one pid, the holder.
    setsid unshare --net --uts --mount --propagation slave -- bash -c '
        hostname "$1" && mount --bind "$2/etc/hosts" /etc/hosts && : > "$2/run/$1.ready" &&
        exec -a "$3$1" sleep infinity' host "$name" "$DIR" "$MARK" \
        < /dev/null >> "$DIR/log/host-$name.log" 2>&1 &
    pid=$!
    for ((k = 0; k < 200; k++)); do [[ -e $DIR/run/$name.ready ]] && break; sleep 0.01; done
    [[ -e $DIR/run/$name.ready ]] || die "host $name did not come up"
    remember "host-$name" "$pid"
    local link=$PREFIX${name/#node/n}     # node64 -> n64: see the top of this file
    ip link add "$link" type veth peer name eth0 netns "$pid"
    ip link set "$link" master "$BR" up
    nsenter -t "$pid" -n -- sh -ec "
        ip link set lo up
        ip addr add $addr/24 dev eth0
        ip link set eth0 up
        sysctl -qw net.ipv6.conf.all.disable_ipv6=1"
}

# daemon_in HOST TAG CMD...: start CMD in HOST as a daemon of ours, recorded as TAG.
daemon_in() {
    local name=$1 tag=$2 holder
    shift 2
    holder=$(recorded "host-$name") || die "host $name is not running"
    # nsenter without --pid execs rather than forks, so $! is the daemon itself
    setsid nsenter -t "$holder" -n -u -m -- "$@" < /dev/null >> "$DIR/log/$tag.log" 2>&1 &
    remember "$tag" $!
}

node_addr() {    # nodeI -> its address, from the config
    [[ $1 =~ ^node([1-9]|[1-5][0-9]|6[0-4])$ ]] || die "no such node '$1' (nodes are node1..node64)"
    local a
    a=$(sed -n "s/^NodeName=$1 NodeAddr=\([0-9.]*\) .*/\1/p" "$CONF" 2>/dev/null)
    [[ -n $a ]] || die "$1 is not a node of the cluster in $DIR"
    echo "$a"
}

node_boot() {    # nodeI
    host_up "$1" "$(node_addr "$1")"
    mkdir -p "$DIR/spool/slurmd-$1"
    daemon_in "$1" "slurmd-$1" slurmd -D -N "$1" -f "$CONF"
}

# ---------------------------------------------------------------- the config

write_config() { # N
    local n=$1 login i k
    login=$(hostname -s)
    [[ $login =~ ^(login|ctl|node[0-9]+|localhost)$ ]] &&
        die "this machine's name '$login' is one of the simulated hosts' names"
    {
        echo "# the test cluster's /etc/hosts, bind-mounted in every simulated host"
        echo "127.0.0.1 localhost"
        echo "$NET.1 login $login"
        echo "$NET.2 ctl"
        for ((i = 1; i <= n; i++)); do echo "$NET.$((10 + i)) node$i"; done
    } > "$DIR/etc/hosts"
    cat > "$CONF" << EOF
# distkernel's test cluster ($n nodes), written by tests/slurm/cluster.sh
ClusterName=distkernel-test
SlurmctldHost=ctl($NET.2)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/socket
StateSaveLocation=$DIR/ctld
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.daemon.log
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.daemon.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=$SELECT
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=20
KillWait=5
MinJobAge=60
InactiveLimit=0
MessageTimeout=10
$( ((GPUS)) && echo GresTypes=gpu )
NodeName=DEFAULT CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=2048 State=UNKNOWN
EOF
    if ((WORKAROUND)); then
        echo "# Slurm bug 16401 (see tests/slurm/cluster.sh): this host, as a node never used"
        echo "NodeName=login NodeHostname=$login NodeAddr=$NET.1 State=FUTURE"
    fi >> "$CONF"
    echo "$WORKAROUND" > "$DIR/workaround"
    echo "$SELECT" > "$DIR/select"
    echo "$CPUS" > "$DIR/cpus"
    echo "$GPU_TYPE" > "$DIR/gputype"
    local gres_type="" conf_type=""
    if [[ $GPU_TYPE != none ]]; then
        gres_type="$GPU_TYPE:"
        conf_type=" Type=$GPU_TYPE"
    fi
    # GPUs: GRES with File= (Slurm's CUDA_VISIBLE_DEVICES index is the file's
    # number); slurmd only stats the files (no cgroups here).
    : > "$DIR/etc/gres.conf"
    for ((i = 1; i <= n; i++)); do
        echo "NodeName=node$i NodeAddr=$NET.$((10 + i)) NodeHostname=node$i" \
             "$( ((GPUS)) && echo "Gres=gpu:$gres_type$GPUS" )" >> "$CONF"
        if ((GPUS)); then
            mkdir -p "$DIR/dev/node$i"
            # character devices (slurmd wants them), of NVIDIA's major with
            # no driver behind: nothing opens them
            for ((k = 0; k < GPUS; k++)); do mknod "$DIR/dev/node$i/nvidia$k" c 195 "$k"; done
            echo "NodeName=node$i Name=gpu$conf_type File=$DIR/dev/node$i/nvidia[0-$((GPUS - 1))]" \
                >> "$DIR/etc/gres.conf"
        fi
    done
    local nodes="node[1-$n]"
    ((n == 1)) && nodes=node1
    echo "PartitionName=sim Nodes=$nodes Default=YES MaxTime=INFINITE State=UP" >> "$CONF"
    echo "PartitionName=stuck Nodes=$nodes MaxTime=INFINITE State=DOWN" >> "$CONF"
    echo "PartitionName=short Nodes=$nodes DefaultTime=1 MaxTime=5 State=UP" >> "$CONF"
    echo "$n" > "$DIR/nodes"
}

# ---------------------------------------------------------------- commands

healthy() {      # N: our cluster with N nodes runs and every node is idle
    [[ -r $DIR/nodes && $(< "$DIR/nodes") == "$1" ]] || return 1
    local w=1      # a cluster from before the setting always had the workaround
    [[ -r $DIR/workaround ]] && w=$(< "$DIR/workaround")
    [[ $w == "$WORKAROUND" ]] || return 1
    local sel=CR_CPU
    [[ -r $DIR/select ]] && sel=$(< "$DIR/select")
    [[ $sel == "$SELECT" ]] || return 1
    local gt=none  # a cluster from before the setting had untyped GPUs
    [[ -r $DIR/gputype ]] && gt=$(< "$DIR/gputype")
    [[ $gt == "$GPU_TYPE" ]] || return 1
    local cpus=2   # a cluster from before the file had the default
    [[ -r $DIR/cpus ]] && cpus=$(< "$DIR/cpus")
    [[ $cpus == "$CPUS" ]] || return 1
    recorded munged > /dev/null && recorded slurmctld > /dev/null || return 1
    local i
    for ((i = 1; i <= $1; i++)); do recorded "slurmd-node$i" > /dev/null || return 1; done
    [[ $(SLURM_CONF=$CONF timeout 5 sinfo -h -p sim -o '%T %D' 2>/dev/null) == "idle $1" ]]
}

print_env() {
    echo "SLURM_CONF=$CONF"
    echo "DISTKERNEL_SLURM_SIM_DIR=$DIR"
    echo "DISTKERNEL_SLURM_SIM_LOGIN_ADDR=$NET.1"
    echo "DISTKERNEL_SLURM_SIM_SRUN_WORKAROUND=$WORKAROUND"
    echo "DISTKERNEL_SLURM_SIM_SELECT=$SELECT"
    echo "DISTKERNEL_SLURM_SIM_GPU_TYPE=$GPU_TYPE"
}

cmd_up() {
    local n=${1:-2} i k
    [[ $n =~ ^([1-9]|[1-5][0-9]|6[0-4])$ ]] || die "node count must be 1 to 64, got '$n'"
    [[ $(id -u) == 0 ]] || die "must run as root (it makes network namespaces and a bridge)"
    for c in unshare nsenter ip setsid munged mungekey slurmctld slurmd sinfo; do
        command -v "$c" > /dev/null || die "'$c' is not installed; run scripts/deps.sh"
    done
    if healthy "$n"; then
        print_env
        echo reused
        return 0
    fi
    if [[ -e $DIR ]] || ip link show "$BR" &> /dev/null; then cmd_down; fi   # an earlier cluster's remains
    ip -o -4 addr show | grep -q " inet $NET\." &&
        die "$NET.0/24 is in use on this machine; set DISTKERNEL_SLURM_SIM_NET"
    # A failed bring-up shows the logs and leaves nothing behind.
    trap 'failed_up' EXIT
    mkdir -p "$DIR"/{etc,run,pids,log,ctld,spool,munge}
    chmod 755 "$DIR" "$DIR/munge"     # munged wants its socket's folder world-searchable
    write_config "$n"

    mungekey -c -k "$DIR/munge/key" -b 1024 2>> "$DIR/log/munged.log"
    setsid munged -F -S "$DIR/munge/socket" --key-file="$DIR/munge/key" \
        --pid-file="$DIR/munge/pid" --seed-file="$DIR/munge/seed" --log-file="$DIR/log/munged.log" \
        < /dev/null >> "$DIR/log/munged.log" 2>&1 &
    remember munged $!
    for ((k = 0; k < 200; k++)); do [[ -S $DIR/munge/socket ]] && break; sleep 0.01; done
    [[ -S $DIR/munge/socket ]] || die "munged did not start"

    ip link add "$BR" type bridge
    ip addr add "$NET.1/24" dev "$BR"
    ip link set "$BR" up

    host_up ctl "$NET.2"
    daemon_in ctl slurmctld slurmctld -D -c -f "$CONF"   # -c: no jobs from an earlier cluster
    for ((i = 1; i <= n; i++)); do node_boot "node$i"; done

    # 30 s, and half a second more a node: slurmctld takes the nodes' registrations
    # one by one, and on 2 shared cores 64 slurmds start slowly
    local wait_s=$((30 + n / 2))
    for ((k = 0; k < wait_s * 20; k++)); do
        healthy "$n" && break
        recorded slurmctld > /dev/null || die "slurmctld exited"
        sleep 0.05
    done
    healthy "$n" || die "the nodes were not idle within $wait_s s"
    trap - EXIT
    print_env
    echo started
}

failed_up() {
    set +e
    local f
    for f in "$DIR"/log/*; do
        [[ -s $f ]] && { echo "--- $f (last lines)"; tail -n 5 "$f"; } >&2
    done
    cmd_down
}

cmd_down() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    local hs=() ns=() victims=() h n l
    mapfile -t hs < <(holders | sort -u)
    for h in "${hs[@]}"; do n=$(netns_of "$h") && ns+=("$n"); done
    # Everything in our namespaces is ours: daemons, steps, tasks, escaped orphans.
    if ((${#ns[@]})); then
        # twice: a task may fork between the listing and the kill
        mapfile -t victims < <(in_netns "${ns[@]}")
        kill_all "${victims[@]}"
        mapfile -t victims < <(in_netns "${ns[@]}")
        kill_all "${victims[@]}"
    fi
    local m
    if m=$(recorded munged); then kill_all "$m"; fi
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
        [[ $l == "$PREFIX"* ]] && ip link del "$l" 2>/dev/null || true
    done
    if ip link show "$BR" &> /dev/null; then ip link del "$BR"; fi
    # The folder goes only if it is one of ours (a stray setting must not wipe a stranger's).
    if [[ -d $DIR ]]; then
        if [[ -e $DIR/nodes || -d $DIR/pids ]]; then rm -rf "$DIR"; else
            note "left $DIR alone: it is not a test cluster's folder"; fi
    fi
    return 0
}

cmd_leftovers() {
    local found=0 f a0 c
    for f in /proc/[0-9]*/cmdline; do
        a0=""
        IFS= read -r -d '' a0 2> /dev/null < "$f" || true
        c=$(tr '\0' ' ' 2> /dev/null < "$f") || continue
        if [[ $a0 == "$MARK"* || $c == *"$DIR/"* ]]; then
            f=${f#/proc/}; echo "process ${f%/cmdline}: $c"; found=1
        fi
    done
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
        [[ $l == "$PREFIX"* || $l == "$BR" ]] && { echo "link $l"; found=1; }
    done
    [[ -e $DIR ]] && { echo "folder $DIR"; found=1; }
    return $((found))
}

cmd_node() {     # kill|start|exec|pids nodeI [CMD...]
    local what=$1 node=${2:-} h
    [[ -n $node ]] || die "usage: cluster.sh $what nodeI"
    shift 2
    node_addr "$node" > /dev/null
    case $what in
    kill)
        h=$(recorded "host-$node") || die "$node is not running"
        local n victims=()
        n=$(netns_of "$h")
        mapfile -t victims < <(in_netns "$n")
        # A crash ends every process at the same instant. One kill(1) of
        # many pids signals them in turn, and a node agent SIGKILLed a moment
        # after its ranks could tell their deaths first (its rank killed,
        # not its node lost). Stopped first, none of them acts any more.
        ((${#victims[@]} == 0)) || kill -STOP "${victims[@]}" 2> /dev/null || true
        kill_all "${victims[@]}"
        rm -f "$DIR/pids/host-$node" "$DIR/pids/slurmd-$node"
        ;;
    start)
        recorded "host-$node" > /dev/null && die "$node is running already"
        node_boot "$node"
        ;;
    exec)
        h=$(recorded "host-$node") || die "$node is not running"
        exec nsenter -t "$h" -n -u -m -- "$@"
        ;;
    pids)
        h=$(recorded "host-$node") || die "$node is not running"
        in_netns "$(netns_of "$h")"
        ;;
    esac
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) cmd_down ;;
leftovers) cmd_leftovers ;;
kill | start | exec | pids) cmd_node "$@" ;;
*) die "usage: cluster.sh up [N] | down | kill|start|exec|pids nodeI | leftovers" ;;
esac
