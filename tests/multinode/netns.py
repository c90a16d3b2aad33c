"""Simulated hosts for multi-node tests: Linux network namespaces on one private bridge.

Each `Host` is a network namespace with its own address on a /24 that exists only on a
bridge this module creates (no uplink, no address in the root namespace: traffic stays
between the hosts). A host has its own hostname (a UTS namespace per started process) that
resolves to its own address (`/etc/netns/<ns>/hosts`, bind-mounted over /etc/hosts in a
mount namespace per started process), like a node of a real cluster. `Host.wrap` runs a
command inside; `Host.kill()` SIGKILLs every process in the namespace (the host "dies"),
`Host.cut()` / `Host.restore()` take its link down and up.

Every name carries `PREFIX` and the owning process id, so `remove_leftovers()` can clean up
after a run that was killed before its finalizers ran. Needs root and iproute2.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

PREFIX = "arlmn"  # every namespace, link and /etc/netns folder of this harness starts with it
SUBNET = "10.213.0"  # private: exists only on the harness's bridge
NETNS_ETC = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable_reason() -> str | None:
    """Why namespaced hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "multi-node tests create network namespaces, which needs root"
    if not all(shutil.which(tool) for tool in ("ip", "unshare", "nsenter")):
        return "multi-node tests need `ip` (iproute2), `unshare` and `nsenter` (util-linux); apt-get install them"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    try:
        if made.returncode != 0:
            return f"`ip netns add` does not work here: {made.stderr.strip()}"
        enter = ["nsenter", f"--net=/run/netns/{probe}", "unshare", "--uts", "--mount", "true"]
        ran = subprocess.run(enter, capture_output=True, text=True, timeout=30)
        if ran.returncode != 0:
            return f"entering a network namespace does not work here ({' '.join(enter)}): {ran.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def namespace_pids(ns: str) -> list[int]:
    """Every process whose network namespace is `ns`."""
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


def kill_namespace(ns: str, timeout: float = 10.0) -> None:
    """SIGKILL every process in `ns` until none is left (children may be forked meanwhile)."""
    deadline = time.monotonic() + timeout
    while pids := namespace_pids(ns):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {ns} survive SIGKILL")
        time.sleep(0.05)


def _owner_alive(name: str) -> bool:
    digits = name[len(PREFIX) :].split("h")[0].split("v")[0].split("b")[0]
    return digits.isdigit() and Path(f"/proc/{digits}").exists()


def remove_leftovers() -> list[str]:
    """Delete every harness namespace, link and hosts file whose owning process is gone."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(PREFIX) and not _owner_alive(ns):
            kill_namespace(ns)
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX) and not _owner_alive(name):
            _ip("link", "del", name, check=False)
            removed.append(name)
    if NETNS_ETC.is_dir():
        for folder in NETNS_ETC.glob(f"{PREFIX}*"):
            if not _owner_alive(folder.name):
                shutil.rmtree(folder, ignore_errors=True)
    return removed


class Host:
    """One simulated machine: a network namespace with an address, a hostname and processes."""

    def __init__(self, network: Network, index: int) -> None:
        self.index = index
        self.ns = f"{network.tag}h{index}"
        self.veth = f"{network.tag}v{index}"  # the host side of its link, on the bridge
        self.addr = f"{SUBNET}.{index + 2}"
        self.hostname = f"node{index}"
        self.procs: list[subprocess.Popen] = []

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` as run inside this host: its network, its hostname, its /etc/hosts.

        `nsenter --net` rather than `ip netns exec`, which remounts /sys and so hides the
        cgroup mounts that daemons such as slurmd need."""
        inner = 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"'
        hosts = str(NETNS_ETC / self.ns / "hosts")
        enter = ["nsenter", f"--net=/run/netns/{self.ns}", "unshare", "--uts", "--mount", "--propagation", "private"]
        return [*enter, "sh", "-c", inner, self.hostname, hosts, *cmd]

    def popen(self, cmd: list[str], log: Path | str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        """Start `cmd` in this host, output to `log`, in its own session; killed at teardown."""
        out = open(log, "ab")
        try:
            proc = subprocess.Popen(
                self.wrap(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, **kw
            )
        finally:
            out.close()
        self.procs.append(proc)
        return proc

    def run(self, cmd: list[str], timeout: float = 60.0, env: dict[str, str] | None = None, **kw):
        """Run `cmd` in this host to completion; a CompletedProcess with text output."""
        return subprocess.run(self.wrap(cmd), capture_output=True, text=True, timeout=timeout, env=env, **kw)

    def pids(self) -> list[int]:
        return namespace_pids(self.ns)

    def kill(self) -> None:
        """The host dies: every process in it is SIGKILLed at once."""
        kill_namespace(self.ns)
        for proc in self.procs:
            proc.poll()

    def power_off(self) -> None:
        """The host is lost as a machine is: its link goes silent first (peers get no FIN or
        RST, as from a dead machine), then every process in it is killed."""
        self.cut()
        self.kill()

    def cut(self) -> None:
        """Pull the host's cable: its link to the bridge goes down (processes keep running)."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")


class Network:
    """`n` hosts on one private bridge; `close()` removes everything it made."""

    def __init__(self, n: int) -> None:
        if n < 1 or n > 9:
            raise ValueError(f"Network(n={n}): between 1 and 9 hosts")
        self.tag = f"{PREFIX}{os.getpid()}"  # <= 15 characters with the suffixes (Linux link names)
        self.bridge = f"{self.tag}br"
        self.hosts = [Host(self, i) for i in range(n)]

    def create(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts:
                self._add_host(host)
        except Exception:
            self.close()
            raise
        return self

    def _add_host(self, host: Host) -> None:
        _ip("netns", "add", host.ns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        _ip("link", "set", host.veth, "master", self.bridge)
        _ip("link", "set", host.veth, "up")
        _ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        _ip("-n", host.ns, "link", "set", "lo", "up")
        etc = NETNS_ETC / host.ns
        etc.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost"] + [f"{h.addr} {h.hostname}" for h in self.hosts]
        (etc / "hosts").write_text("\n".join(lines) + "\n")

    def close(self) -> None:
        """Kill every process in every host, then delete the namespaces, links and hosts files."""
        errors = []
        for host in self.hosts:
            try:
                kill_namespace(host.ns)
            except RuntimeError as e:
                errors.append(str(e))
            for proc in host.procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    errors.append(f"{proc.args[-3:]} did not exit")
            _ip("link", "del", host.veth, check=False)
            _ip("netns", "del", host.ns, check=False)
            shutil.rmtree(NETNS_ETC / host.ns, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
        if errors:
            raise RuntimeError("; ".join(errors))

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()
