"""Two hosts on one machine, for the tests and benchmarks of runs across machines: two network namespaces joined by a
veth pair, with addresses from 198.18.0.0/15 (RFC 2544's benchmarking range: never routed), each with its loopback up.
A process started on a host (`Host.popen`) sees only that host's network: its veth address and its loopback; nothing
else is reachable from it. The hosts share this machine's filesystem, so each test gives each host a directory of its
own (its --train_dir) and checks that neither reads the other's.

    with TwoHosts() as (h0, h1):                      # root only: `why_not()` says why it cannot be made
        p = h0.popen(["python", "train.py", ...], log)   # runs in h0's namespace
        h1.cut()                                      # h1's link down: a node whose network goes away

Each host gives up a dead TCP peer after a few seconds (net.ipv4.tcp_retries2=3, tcp_syn_retries=1 in its namespace),
as a cluster's nodes are advised to. Everything made is removed on exit, the processes left in either namespace killed
first. Names carry this process's
pid (two test runs never share one), and a /30 of 198.18.0.0/15 picked from it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NET = "198.18"  # 198.18.0.0/15: addresses 198.18.a.b with a in 0..255 (and 198.19.*)
RDZV_PORT = 29400  # torchrun's rendezvous on host 0 (each host has a network of its own: no other process holds it)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def why_not() -> str | None:
    """Why two hosts cannot be made here (not root, no `ip`, namespaces refused), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    name = f"sfprobe{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class Host:
    index: int
    netns: str
    dev: str  # its end of the veth pair
    addr: str

    def popen(self, cmd: list[str], log: Path, env: dict | None = None, **kwargs) -> subprocess.Popen:
        """`cmd` in this host's namespace, in a session of its own, stdout and stderr to `log`. Gloo is told which
        interface is this host's (GLOO_SOCKET_IFNAME): the hosts' names resolve to nothing."""
        env = dict(os.environ if env is None else env, GLOO_SOCKET_IFNAME=self.dev, PYTHONUNBUFFERED="1")
        return subprocess.Popen(["ip", "netns", "exec", self.netns, *cmd], stdout=open(log, "w"),
                                stderr=subprocess.STDOUT, start_new_session=True, env=env, **kwargs)

    def torchrun(self, rdzv_host: "Host", rdzv_id: str, script_args: list[str]) -> list[str]:
        """The command of this host's torchrun, one rank, the c10d rendezvous at `rdzv_host`. --local-addr: the address
        this node is known by (the hosts' names resolve to nothing) and its rank's order (c10d ranks the nodes by it:
        host 0's is the lower). is_host: which node serves the rendezvous store (torch guesses it from the hostname,
        the same on both hosts here). No restarts: a failure ends the run."""
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{rdzv_host.addr}:{RDZV_PORT}", "--rdzv-id", rdzv_id,
                "--rdzv-conf", f"is_host={int(self is rdzv_host)}", "--local-addr", self.addr, "--max-restarts", "0",
                *script_args]

    def pids(self) -> list[int]:
        """The processes living in this host's namespace."""
        out = _ip("netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def cut(self) -> None:
        """Take this host's link down: its peer's packets go nowhere (no reset, no error: a node gone from the
        network)."""
        _ip("-n", self.netns, "link", "set", self.dev, "down")

    def uncut(self) -> None:
        """The link up again (its address stays)."""
        _ip("-n", self.netns, "link", "set", self.dev, "up")


class TwoHosts:
    def __init__(self):
        pid = os.getpid()
        a, b = (pid >> 6) % 256, (pid % 64) * 4  # a /30 of 198.18.0.0/16 from the pid
        self.hosts = [Host(i, f"sfh{i}_{pid}", f"sfv{i}_{pid}", f"{NET}.{a}.{b + 1 + i}") for i in range(2)]
        self.made: list[str] = []

    def __enter__(self) -> tuple[Host, Host]:
        try:
            h0, h1 = self.hosts
            for h in self.hosts:
                _ip("netns", "add", h.netns)
                self.made.append(h.netns)
            _ip("link", "add", h0.dev, "type", "veth", "peer", "name", h1.dev)
            for h in self.hosts:
                _ip("link", "set", h.dev, "netns", h.netns)
                _ip("-n", h.netns, "addr", "add", f"{h.addr}/30", "dev", h.dev)
                _ip("-n", h.netns, "link", "set", h.dev, "up")
                _ip("-n", h.netns, "link", "set", "lo", "up")
                # A dead TCP peer (a link down: no reset) is given up after 3 retransmissions (~3 s) and an unanswered
                # connection after 1 SYN retry, instead of the kernel's ~15 min and ~2 min: the time torchrun's agent
                # on a cut-off node waits on its rendezvous store before it exits (docs/distributed.md#a-lost-node)
                subprocess.run(["ip", "netns", "exec", h.netns, "sysctl", "-q", "-w", "net.ipv4.tcp_retries2=3",
                                "net.ipv4.tcp_syn_retries=1"], check=True, capture_output=True, timeout=30)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return h0, h1

    def leftovers(self) -> list[int]:
        """Processes still living in either namespace."""
        return [p for h in self.hosts if h.netns in self.made for p in h.pids()]

    def __exit__(self, *exc) -> None:
        """Kill what is left in the namespaces, then remove them (their veth ends go with them)."""
        for _ in range(50):
            pids = self.leftovers()
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for name in self.made:
            _ip("netns", "del", name, check=False)
        self.made = []
