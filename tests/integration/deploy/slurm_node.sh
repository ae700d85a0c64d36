#!/usr/bin/env bash
# A one-node Slurm of the test's own, for deploy_slurm (sourced): its own
# munged (key, socket, pid and seed files), slurmctld and slurmd with their
# own slurm.conf, state, spool, logs and ports, all under one folder; the
# Slurm commands find it through SLURM_CONF. Meant to run in a network
# and mount namespace of the caller's own (ports and /etc/hosts are its
# own there) whose host name is NODE (slurmctld runs only on the host the
# configuration names), as root (SlurmUser root: jobs run as their
# submitter).
#
#   slurm_up DIR NODE CPUS   starts it; 0 once the node is idle, else 1
#                            with the daemons' last log lines
#   slurm_down               stops every daemon slurm_up started, by pid
#
# The node is NODE (a name /etc/hosts gives), with CPUS CPUs whatever the
# machine has (SlurmdParameters=config_overrides), one partition "tsr".

SLURM_PIDS=()

# slurm_ns NODE DIR: inside a fresh network, mount and UTS namespace
# (unshare -n -m -u): loopback up, the host named NODE, /etc/hosts (a copy
# in DIR bound over it) giving NODE and localhost as 127.0.0.1 and ::1,
# and a veth pair holding 192.0.2.1 (a documentation address nothing is
# sent to) because Slurm's daemons resolve their listening address with
# AI_ADDRCONFIG, which finds nothing where only loopback has an address.
slurm_ns() {
  local node=$1 d=$2
  ip link set lo up &&
    hostname "$node" &&
    ip link add tsrslurm0 type veth peer name tsrslurm1 &&
    ip addr add 192.0.2.1/32 dev tsrslurm0 &&
    ip link set tsrslurm0 up && ip link set tsrslurm1 up &&
    printf '127.0.0.1 localhost %s\n::1 localhost %s\n' "$node" "$node" >"$d/hosts" &&
    mount --bind "$d/hosts" /etc/hosts
}

slurm_up() {
  local d=$1 node=$2 cpus=$3 i
  mkdir -p "$d/state" "$d/spool" "$d/munge"
  chmod 0755 "$d/munge"
  dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$d/munge/munge.key"
  munged --force --key-file="$d/munge/munge.key" --socket="$d/munge/munge.sock" \
    --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" \
    --seed-file="$d/munge/munged.seed" || { tail -n 5 "$d/munge/munged.log"; return 1; }
  SLURM_PIDS+=("$(cat "$d/munge/munged.pid")")
  cat >"$d/slurm.conf" <<EOF
ClusterName=tsrtest
SlurmctldHost=$node
MailProg=/bin/true
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket=$d/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
NodeName=$node CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=tsr Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$d/slurm.conf
  slurmctld -f "$d/slurm.conf" -i || { tail -n 20 "$d/slurmctld.log"; return 1; }
  for i in $(seq 100); do [ -s "$d/slurmctld.pid" ] && break; sleep 0.1; done
  SLURM_PIDS+=("$(cat "$d/slurmctld.pid" 2>/dev/null)")
  slurmd -f "$d/slurm.conf" -N "$node" || { tail -n 20 "$d/slurmd.log"; return 1; }
  for i in $(seq 100); do [ -s "$d/slurmd.pid" ] && break; sleep 0.1; done
  SLURM_PIDS+=("$(cat "$d/slurmd.pid" 2>/dev/null)")
  for i in $(seq 300); do
    case "$(sinfo -h -n "$node" -o %T 2>/dev/null)" in
      idle*) return 0 ;;
    esac
    sleep 0.1
  done
  echo "slurm: node $node not idle after 30 s: $(sinfo -h -o '%T %E' 2>&1)"
  tail -n 15 "$d/slurmctld.log" "$d/slurmd.log"
  return 1
}

slurm_down() {
  local p i
  # no job outlives the test: cancel what is left and let slurmd end it
  if [ ${#SLURM_PIDS[@]} -ge 3 ]; then
    scancel -p tsr 2>/dev/null
    for _ in $(seq 150); do
      [ -z "$(squeue -h -p tsr -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  # slurmd first (it ends its job steps), then slurmctld, then munged
  for ((i = ${#SLURM_PIDS[@]} - 1; i >= 0; i--)); do
    p=${SLURM_PIDS[$i]}
    [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
  done
  SLURM_PIDS=()
  return 0
}
