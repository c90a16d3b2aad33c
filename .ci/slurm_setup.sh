#!/usr/bin/env bash
# Install and start a single-node Slurm (munge, slurmctld, slurmd from Debian's packages) so
# that the Slurm launcher tests run against a real Slurm. Idempotent: returns at once when
# this node is already up. Needs root (apt-get, daemons). Oversubscription is allowed so that
# test jobs asking for several CPUs run on a 2-core machine.
set -euo pipefail

node="$(hostname -s)"

slurm_up() {
  # The controller's view lags a dead slurmd by minutes, so the daemons are checked directly too.
  pgrep -x munged >/dev/null && pgrep -x slurmctld >/dev/null && pgrep -x slurmd >/dev/null &&
    command -v sinfo >/dev/null 2>&1 && scontrol ping 2>/dev/null | grep -q "is UP" &&
    sinfo -h -N -n "$node" -o "%T" 2>/dev/null | grep -qE "^(idle|mixed|allocated)"
}

if slurm_up; then
  echo "slurm_setup: Slurm is already up on $node"
  exit 0
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi

# munge: the key is created by the package; the daemon runs as the munge user.
mkdir -p /run/munge /var/log/munge /var/lib/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key && chmod 0755 /run/munge
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- /usr/sbin/munged
fi

cpus=16  # more than the machine has: slurmd trusts slurm.conf (config_overrides)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat >/etc/slurm/slurm.conf <<CONF
ClusterName=arealite
SlurmctldHost=${node}
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=${node} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF

if ! pgrep -x slurmctld >/dev/null; then
  /usr/sbin/slurmctld
fi
if ! pgrep -x slurmd >/dev/null; then
  /usr/sbin/slurmd
fi

for _ in $(seq 1 60); do
  if slurm_up; then
    echo "slurm_setup: Slurm is up on $node"
    exit 0
  fi
  # A node left DOWN by an earlier daemon comes back once the daemons answer.
  scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm_setup: Slurm did not come up; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
sinfo -N -l >&2 || true
exit 1
