"""The namespace harness itself: own addresses and hostnames, a link that can be cut, a host
that can be killed, and nothing left behind (also after a run that died before cleaning up)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.multinode.netns import PREFIX, Network, namespace_pids, remove_leftovers

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(120)]

ECHO_SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True)
while True:
    c, peer = s.accept(); c.sendall(f"{socket.gethostname()} sees {peer[0]}".encode()); c.close()
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
print(c.recv(100).decode())
"""


def _listen(host, tmp_path) -> int:
    log = tmp_path / f"echo{host.index}.log"
    host.popen([sys.executable, "-c", ECHO_SERVER, host.addr], log)
    deadline = time.monotonic() + 30
    while not log.read_text().strip():
        assert time.monotonic() < deadline, "echo server did not start"
        time.sleep(0.05)
    return int(log.read_text().split()[0])


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def test_hosts_talk_over_their_own_addresses_and_a_cut_link_stops_them(network, tmp_path):
    a, b = network(2).hosts
    port = _listen(b, tmp_path)
    got = a.run([sys.executable, "-c", CLIENT, "node1", str(port), "5"])
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == f"node1 sees {a.addr}"  # b's hostname, a's own address as the peer
    assert a.run(["hostname"]).stdout.strip() == "node0"
    b.cut()
    cut = a.run([sys.executable, "-c", CLIENT, b.addr, str(port), "1"])
    assert cut.returncode != 0 and "timed out" in cut.stderr
    b.restore()
    deadline = time.monotonic() + 20
    while a.run([sys.executable, "-c", CLIENT, b.addr, str(port), "1"]).returncode != 0:
        assert time.monotonic() < deadline, "the link did not come back"


def test_killed_host_loses_every_process_and_close_removes_everything(netns_ready, tmp_path):
    net = Network(2).create()
    try:
        a, b = net.hosts
        _listen(a, tmp_path)
        b.popen(["sh", "-c", "sleep 600 & sleep 600 & wait"], tmp_path / "sleep.log")  # a process tree
        deadline = time.monotonic() + 10
        while len(b.pids()) < 3:
            assert time.monotonic() < deadline, b.pids()
            time.sleep(0.05)
        b.kill()
        assert b.pids() == [] and len(a.pids()) == 1
    finally:
        net.close()
    assert namespace_pids(a.ns) == []
    assert net.tag not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.tag not in _links()


def test_leftovers_of_a_dead_owner_are_removed(netns_ready):
    dead = _dead_pid()
    ns, link = f"{PREFIX}{dead}h0", f"{PREFIX}{dead}br"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", link, "type", "bridge"], check=True)
    removed = remove_leftovers()
    assert ns in removed and link in removed
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert link not in _links()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
