# tests/netns_hosts.sh: hosts made of network namespaces, for tests/e2e_hosts.sh and
# bench/bench_hosts.sh (sourced; needs root, iproute2, unshare and Open MPI).
#
# hosts_up N PREFIX DIR makes N hosts h1..hN: a network namespace each (PREFIXh1, ...), its
# eth0 a veth to one bridge in a namespace of its own (PREFIXsw), address 10.77.0.i/24.
# Nothing is made outside those namespaces. A process started on host hI (in_host, or
# mpirun's rsh agent DIR/agent) also gets:
#  - its own hostname, hI (a UTS namespace), so Open MPI and Strata see distinct hosts;
#  - its own mount namespace in which DIR/node is DIR/node-hI: a node-local directory at one
#    path on every host, as a compute node's local disk is. Everything else (DIR itself,
#    /tmp, the binaries) is shared, as a shared filesystem is.
# "$DIR/on" HOST COMMAND... runs COMMAND there the same way (in_host, below).
# hosts_down kills every process left in those namespaces and deletes them; call it from
# an EXIT trap. HOSTS_MPI holds mpirun's options for a job across the hosts (to be run on
# h1: in_host h1 mpirun "${HOSTS_MPI[@]}" --host h1:2,h2:2 -np 4 ...).

HOSTS_PREFIX=""
HOSTS_N=0
HOSTS_DIR=""
HOSTS_SUBNET=10.77.0.0/24

hosts_up() {
  HOSTS_N=$1 HOSTS_PREFIX=$2 HOSTS_DIR=$3
  ip netns add "${HOSTS_PREFIX}sw" || return 1
  ip -n "${HOSTS_PREFIX}sw" link add br0 type bridge || return 1
  ip -n "${HOSTS_PREFIX}sw" link set br0 up || return 1
  local i
  for i in $(seq "$HOSTS_N"); do
    ip netns add "${HOSTS_PREFIX}h$i" || return 1
    ip link add eth0 netns "${HOSTS_PREFIX}h$i" type veth peer name "h$i" netns "${HOSTS_PREFIX}sw" || return 1
    ip -n "${HOSTS_PREFIX}sw" link set "h$i" master br0 up || return 1
    ip -n "${HOSTS_PREFIX}h$i" link set lo up || return 1
    ip -n "${HOSTS_PREFIX}h$i" addr add "10.77.0.$i/24" dev eth0 || return 1
    ip -n "${HOSTS_PREFIX}h$i" link set eth0 up || return 1
    mkdir -p "$HOSTS_DIR/node-h$i"
  done
  mkdir -p "$HOSTS_DIR/node"
  # mpirun's remote start: `agent HOST COMMAND...`, as `ssh HOST COMMAND...` would run it
  cat > "$HOSTS_DIR/agent" <<EOF
#!/bin/sh
h=\$1; shift
exec ip netns exec "${HOSTS_PREFIX}\$h" unshare --uts --mount sh -c \
  'hostname "\$0" && mount --bind "\$1/node-\$0" "\$1/node" && exec sh -c "\$2"' "\$h" "$HOSTS_DIR" "\$*"
EOF
  cat > "$HOSTS_DIR/on" <<EOF
#!/bin/sh
h=\$1; shift
exec ip netns exec "${HOSTS_PREFIX}\$h" unshare --uts --mount sh -c \
  'hostname "\$0" && mount --bind "\$1/node-\$0" "\$1/node" && shift && exec "\$@"' "\$h" "$HOSTS_DIR" "\$@"
EOF
  chmod +x "$HOSTS_DIR/agent" "$HOSTS_DIR/on"
  local btl=vader
  ompi_info 2> /dev/null | grep -q "MCA btl: vader" || btl=sm # Open MPI 5 renamed it
  HOSTS_MPI=(--allow-run-as-root --mca plm_rsh_agent "$HOSTS_DIR/agent"
    --mca oob_tcp_if_include "$HOSTS_SUBNET" --mca btl_tcp_if_include "$HOSTS_SUBNET" --mca btl "self,$btl,tcp"
    --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3
    -x OMP_NUM_THREADS=1 --wdir "$HOSTS_DIR")
}

# in_host HOST COMMAND...: COMMAND on HOST, as the agent would start it (a script, so that
# `timeout` can run it: "$HOSTS_DIR/on" HOST COMMAND...)
in_host() { "$HOSTS_DIR/on" "$@"; }

# the pids of COMMAND's processes (by its name, as /proc/PID/comm holds it) on HOST
host_pids() {
  local p
  for p in $(ip netns pids "${HOSTS_PREFIX}$1" 2> /dev/null); do
    [ "$(cat /proc/$p/comm 2> /dev/null)" = "$2" ] && echo "$p"
  done
}

# received bytes of HOST's eth0
host_rx_bytes() { ip -n "${HOSTS_PREFIX}$1" -s -j link show eth0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'; }

# Every step may fail (hosts_up stopped half way, a process already gone): none may end the
# caller's EXIT trap under set -e, or the namespaces after it would be left and a skip
# would exit 1.
hosts_down() {
  [ -n "$HOSTS_PREFIX" ] || return 0
  local ns i
  for i in $(seq "$HOSTS_N") sw; do
    ns=${HOSTS_PREFIX}h$i
    [ "$i" = sw ] && ns=${HOSTS_PREFIX}sw
    [ -e "/run/netns/$ns" ] || continue
    { ip netns pids "$ns" 2> /dev/null || true; } | xargs -r kill -KILL 2> /dev/null || true
    ip netns del "$ns" 2> /dev/null || true
  done
  HOSTS_PREFIX=""
  return 0
}
