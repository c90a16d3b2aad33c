"""Cluster software on namespaced hosts: a Ray head and worker nodes, started with `ray start`.

Token authentication is on (Ray 2.60's default for new clusters): every node and the driver
share one random RAY_AUTH_TOKEN, as `docs/multinode.md` tells users to do.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.multinode.netns import Host

RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
HEAD_PORT = 6379  # every host has its own network: the default port is free on each


def ray_env() -> dict[str, str]:
    """The environment of every Ray process of one test cluster (nodes and driver)."""
    return dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex, OMP_NUM_THREADS="1")


class RayCluster:
    """A Ray head on `hosts[0]` and a worker node on each other host, `cpus` CPUs each."""

    def __init__(self, hosts: list[Host], logs: Path, cpus: int = 1) -> None:
        self.hosts, self.logs, self.cpus = hosts, logs, cpus
        self.env = ray_env()
        self.address = f"{hosts[0].addr}:{HEAD_PORT}"
        self.temp_dirs: list[str] = []

    def _start(self, host: Host, role: list[str], timeout: float, attempts: int = 3) -> None:
        """`ray start` on `host` until it reports the node started. Ray gives a raylet 30 s to
        register, which a loaded machine can miss; then the host's leftovers are killed and
        the start is tried again."""
        for _ in range(attempts):
            temp_dir = tempfile.mkdtemp(prefix="rmn")  # one per node (sockets), short (< 108 bytes)
            self.temp_dirs.append(temp_dir)
            cmd = [RAY_CLI, "start", "--block", *role, f"--node-ip-address={host.addr}", f"--num-cpus={self.cpus}"]
            cmd += ["--disable-usage-stats", f"--temp-dir={temp_dir}"]
            log = self.logs / f"ray-{host.hostname}-{len(self.temp_dirs)}.log"
            proc = host.popen(cmd, log, env=self.env)
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                if "Ray runtime started" in log.read_text(errors="replace"):
                    return
                time.sleep(0.5)
            host.kill()
        tails = {p.name: p.read_text(errors="replace")[-1500:] for p in self.logs.glob("ray-*.log")}
        raise RuntimeError(f"ray start on {host.hostname} failed {attempts} times: {tails}")

    def start(self, timeout: float = 120.0) -> RayCluster:
        self._start(self.hosts[0], ["--head", f"--port={HEAD_PORT}", "--include-dashboard=false"], timeout)
        for host in self.hosts[1:]:
            self._start(host, [f"--address={self.address}"], timeout)
        return self

    def rejoin(self, host: Host, timeout: float = 120.0) -> None:
        """Start a worker node again on `host` (after it was lost)."""
        self._start(host, [f"--address={self.address}"], timeout)

    def close(self) -> None:
        for host in self.hosts:
            host.kill()
        for temp_dir in self.temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)


SLURM_CONF = """\
ClusterName=arlmn
SlurmctldHost={ctl}({ctl_addr})
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.sock
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
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.%n.pid
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool.%n
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.%n.log
{nodes}
PartitionName=mn Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class SlurmCluster:
    """slurmctld (and a private munged) on `hosts[0]`, one slurmd per other host, NodeName = hostname."""

    def __init__(self, hosts: list[Host], folder: Path, cpus: int = 4) -> None:
        self.ctl, self.nodes, self.dir = hosts[0], hosts[1:], folder
        self.conf = folder / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), OMP_NUM_THREADS="1")
        node_lines = [f"NodeName={h.hostname} NodeAddr={h.addr} CPUs={cpus} RealMemory=4000" for h in self.nodes]
        self.conf_text = SLURM_CONF.format(
            ctl=self.ctl.hostname, ctl_addr=self.ctl.addr, dir=folder, nodes="\n".join(node_lines),
            names=",".join(h.hostname for h in self.nodes),
        )  # fmt: skip

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        for sub in ["state", *(f"spool.{h.hostname}" for h in self.nodes)]:
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.conf_text)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munged = ["/usr/sbin/munged", "-F", "-f", f"--socket={self.dir}/munge.sock", f"--key-file={key}"]
        munged += [f"--pid-file={self.dir}/munged.pid", f"--seed-file={self.dir}/munge.seed"]
        self.ctl.popen(munged, self.dir / "munged.out")
        self.ctl.popen(["/usr/sbin/slurmctld", "-D", "-c", "-f", str(self.conf)], self.dir / "slurmctld.out")
        self.slurmds = [
            host.popen(["/usr/sbin/slurmd", "-D", "-f", str(self.conf)], self.dir / f"slurmd-{host.hostname}.out")
            for host in self.nodes
        ]
        self.wait_idle(timeout)
        return self

    def sinfo(self) -> str:
        got = self.ctl.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30, env=self.env)
        return got.stdout + got.stderr

    def wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (state := self.sinfo()).count("idle") < len(self.nodes):
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-1500:] for p in self.dir.glob("*.log")} | {
                    p.name: p.read_text()[-800:] for p in self.dir.glob("*.out")
                }
                raise RuntimeError(f"Slurm nodes not idle after {timeout:.0f}s: {state!r}; {logs}")
            time.sleep(0.5)

    def close(self) -> None:
        for host in [self.ctl, *self.nodes]:
            host.kill()
