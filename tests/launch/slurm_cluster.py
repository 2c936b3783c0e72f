"""A real single-node Slurm for the tests: munged, slurmctld and slurmd started in the foreground from a slurm.conf
generated in a temporary folder (own ports, own munge socket and key, no accounting), so nothing of the machine's own
configuration is read or changed. Clients find it through SLURM_CONF (set in os.environ while the cluster is up).

`SlurmCluster.start()` waits until the node is idle; `stop()` cancels every job, stops the daemons and kills whatever
process of this cluster is left (job steps and their children carry SLURM_CONF=<this conf> in their environment).
Run as a script it starts a cluster and waits for Ctrl-C: `python tests/launch/slurm_cluster.py`."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")


def unavailable() -> str | None:
    """Why a test cluster cannot run here (None if it can): Slurm's and munge's programs, and root (slurmd must be)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)} missing): `make setup-slurm` installs them as root"
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (slurmd runs jobs as their users)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    def __init__(self, cpus: int | None = None):
        # more CPUs than the machine's (config_overrides) lets a small sweep's tasks all run at once on a 2-core box
        self.cpus = cpus or max(4, os.cpu_count() or 1)
        self.dir = Path(tempfile.mkdtemp(prefix="sf-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        self._env_before: str | None = None

    def _write_conf(self):
        d = self.dir
        for sub in ("state", "spool", "munge"):
            (d / sub).mkdir(mode=0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        mem_mb = psutil.virtual_memory().total // 2**20 // 2
        self.conf.write_text("\n".join([
            "ClusterName=sftest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none", "MpiDefault=none",
            "JobRequeue=1", "ReturnToService=2", "SlurmdParameters=config_overrides",
            "KillWait=30", "MinJobAge=300", "SchedulerParameters=sched_interval=2",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={mem_mb} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")

    def _start(self, name: str, argv: list[str]):
        log = open(self.dir / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    @property
    def env(self) -> dict:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def run(self, *argv, check=True, timeout=30) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, check=check, timeout=timeout)

    def start(self, timeout: float = 60) -> "SlurmCluster":
        self._write_conf()
        m = self.dir / "munge"
        self._start("munged", [_exe("munged"), "-F", "--force", f"--key-file={m / 'munge.key'}",
                               f"--socket={m / 'munge.socket'}", f"--pid-file={m / 'munged.pid'}",
                               f"--seed-file={m / 'munged.seed'}", f"--log-file={m / 'munged.log'}"])
        self._wait(lambda: (m / "munge.socket").exists(), timeout, "munged's socket")
        self._start("slurmctld", [_exe("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, timeout, "slurmctld")
        self._start("slurmd", [_exe("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])
        self._wait(lambda: self.run("sinfo", "-h", "-N", "-o", "%t", check=False).stdout.strip() == "idle", timeout,
                   "the node to be idle")
        self._env_before = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(self.conf)
        return self

    def _wait(self, pred, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"test Slurm: {dead[0]} exited while waiting for {what}:\n{self.logs()}")
            if pred():
                return
            time.sleep(0.2)
        raise RuntimeError(f"test Slurm: timed out waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")) + [self.dir / "munge" / "munged.log"]:
            if f.exists():
                out.append(f"--- {f.name}:\n" + f.read_text()[-3000:])
        return "\n".join(out)

    def _ours(self) -> list[psutil.Process]:
        """Processes of this cluster's jobs: slurmstepd and the job's processes inherit SLURM_CONF=<this conf>."""
        found = []
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and p.environ().get("SLURM_CONF") == str(self.conf):
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    def stop(self):
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user=root", check=False)
            deadline = time.time() + 40
            while time.time() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        left = [p for p in self._ours() if p.pid not in {q.pid for q in self.procs.values()}]
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)
        if self._env_before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._env_before
        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM too stops it cleanly
    c = SlurmCluster().start()
    print(f"export SLURM_CONF={c.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
