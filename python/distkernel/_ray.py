"""Ray on top of the ranks: `ray_init()` in a rank, `@ray_launch` around a function.

As the managed platform does it, every rank first joins a torch rendezvous (a
TCPStore at MASTER_ADDR:MASTER_PORT, or the process group's store when the
ranks already have one) to agree on the head. Rank 0 runs `ray start --head`
on a free port and publishes its address; every other rank runs
`ray start --address=HEAD` with that address and says it has joined. Rank 0
waits for all of them, sets RAY_ADDRESS and is the Ray driver; the other ranks
wait until the driver is done. Then every rank runs `ray stop`.

`ray stop` must run however the run ends: a failing driver, an interrupt, a
timeout, another rank failing, the rank itself killed. The kernel ends ranks
with SIGINT, then SIGTERM and SIGKILL 2 s apart (runtime/launch/dk_job.h), to
the rank's whole process group. So every wait here is a loop of short waits
(an interrupt lands between them and unwinds through `finally`), and `ray stop`
runs in a session of its own, out of reach of the signals to the rank's group.
While the rank waits for it, SIGINT and SIGTERM are deferred: Python runs a
signal's handler in the main thread whichever thread the signal reached (the
rank has its flusher's and its stacks sampler's threads), so a signal mask in the
main thread would not hold them back; a handler that only notes them does, and
they take effect once `ray stop` is done.

A rank that dies before it gets there (SIGKILL, or a SIGTERM while a starved
rank had not yet woken from its SIGINT) still has its node stopped: before its
`ray start`, each rank starts a watcher in a session of its own, holding the
read end of a pipe whose write end only the rank holds. The rank writes
"stopped" to it once its own `ray stop` has started; a watcher that reads the
end of the pipe without it (the rank is gone) runs `ray stop` itself.

Every rank runs a Ray node, so the ranks of a machine share it: each `ray
start` gets its rank's share of the CPUs and memory (_node_share; Ray's
defaults are each the whole machine's), no dashboard and no usage report.
The ranks of a machine start theirs a few at a time (_started_before), and a
`ray start` that missed Ray's own fixed start-up deadline is tried again
(_run_ray). Ray's output is shown only when a command fails.

"Ray installed" means the `ray` command on PATH: that is what the ranks run.
The kernel checks it before any rank starts (ray_launch's .distributed()).

Who may join. The rendezvous store is open to anyone who reaches
MASTER_ADDR:MASTER_PORT, so what rank 0 publishes there is signed: the head's
address (and whether it asks for a token) goes with an HMAC under a secret of
the run (distkernel._backchannel.run_secret: the back channel's key, which
every rank has and nobody else), and a worker refuses a value whose HMAC does
not verify, naming it, rather than join a head a stranger wrote in. Ray's own
ports are another matter: `ray start --head` accepts whoever reaches them.
Where the installed Ray has token authentication (Ray 2.52 and later:
RAY_AUTH_MODE=token, the token in RAY_AUTH_TOKEN; `ray --version` tells),
every `ray start`, the driver and the workers get a token of the run, derived
from the same key on each rank, so it never crosses the network; an older
Ray has nothing of the kind (its --redis-password guards only an external
Redis since Ray 2.0), and rank 0 says so in the cell once.
"""

import hmac
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

_STORE_PREFIX = "distkernel/ray/"
_POLL = 0.2          # seconds between looks at the store: an interrupt lands in between
_JOIN_TIMEOUT = 600  # seconds the ranks wait for the head, and the head for the ranks
_STOP_TIMEOUT = 60   # seconds a rank waits for its `ray stop`
_TOKEN_AUTH_SINCE = (2, 52)     # Ray's token authentication (RAY_AUTH_MODE=token)
_START_TRIES = 3     # `ray start` tries where Ray's own start-up deadline passed (_run_ray)
_STARTUP_TIMED_OUT = "timed out during startup"     # what Ray says then

_clusters = []       # the RayCluster of this rank, kept alive (rank 0 serves the store)


class RayNotInstalled(RuntimeError):
    pass


def ray_command():
    """The `ray` executable on PATH, or raise RayNotInstalled saying what to do."""
    path = shutil.which("ray")
    if path is None:
        raise RayNotInstalled(
            "ray_launch and ray_init need Ray, and the `ray` command is not on this kernel's "
            "PATH, so nothing was started. Install it where the kernel's Python finds it "
            "(for example: /usr/bin/python3 -m pip install 'ray[default]'), or put the folder "
            "that holds `ray` on PATH before starting the kernel; or use @distributed without "
            "Ray.")
    return path


def _in_a_rank():
    return "RANK" in os.environ and "MASTER_PORT" in os.environ


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


_base_store = []     # this rank's TCPStore, made once: rank 0 serves it on MASTER_PORT


def _node_ip():
    """This node's address for Ray when the ranks span nodes: the source of the
    route to MASTER_ADDR (the first node; its own address there). Ray would
    otherwise take the address of the node's hostname, which on Debian-like
    nodes is 127.0.1.1, where the other nodes cannot reach its raylet and
    object store. None on one node (MASTER_ADDR loopback or unset), where
    Ray's own choice is right."""
    import ipaddress

    master = os.environ.get("MASTER_ADDR", "")
    if not master:
        return None
    try:
        infos = socket.getaddrinfo(master, 9, type=socket.SOCK_DGRAM)
        if ipaddress.ip_address(infos[0][4][0]).is_loopback:
            return None
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)         # nothing is sent: the kernel picks the route
            return s.getsockname()[0]
    except (OSError, ValueError, IndexError):
        return None


def _store(generation):
    """The rendezvous: the process group's store if there is one, else a
    TCPStore that rank 0 serves at MASTER_ADDR:MASTER_PORT. A process group the
    function starts later joins that same store as a client
    (TORCHELASTIC_USE_AGENT_STORE, as under torchrun's agent), so the port is
    not taken twice. Each ray_init() of a rank (GENERATION: how many came
    before) has keys of its own."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        base = dist.distributed_c10d._get_default_store()
    elif _base_store:
        base = _base_store[0]
    else:
        rank = int(os.environ["RANK"])
        base = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                             int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
                             rank == 0, timedelta(seconds=_JOIN_TIMEOUT))
        _base_store.append(base)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    return base, dist.PrefixStore(f"{_STORE_PREFIX}{generation}/", base)


def _wait(store, key, count=1, timeout=None):
    """Wait until counter KEY reaches COUNT. Counters, read with add(key, 0),
    because that never blocks: a store.wait() that times out leaves the
    client's socket unusable (torch 1.13), so an interruptible wait is a loop
    of quick looks and short sleeps, and an interrupt lands between them.
    False when the store went away (rank 0 ended)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            if store.add(key, 0) >= count:
                return True
        except RuntimeError:
            return False
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"Ray's start-up: {key} did not reach {count} within "
                               f"{timeout} s")
        time.sleep(_POLL)


def _run_ray(args, env=None, tries=1):
    """`ray ARGS` (ARGS: a list, or a function that makes one for each try);
    the list it ran. Its output (Ray's banner, a screen a rank) is shown only
    when it fails: at 1,024 ranks the cell would be nothing else.

    TRIES > 1 (`ray start`): tried again when Ray says the node "timed out
    during startup". Ray gives a new node's agents 15 s to write their ports
    and the node 30 s to register, fixed; its agents are Python, and on a
    busy node, or with Ray on a shared file system that is cold, importing
    them takes longer. The failed try's raylet has ended itself."""
    for attempt in range(1, tries + 1):
        argv = args() if callable(args) else args
        done = subprocess.run([ray_command(), *argv], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace")
        if done.returncode == 0:
            return argv
        if attempt < tries and _STARTUP_TIMED_OUT in (done.stdout or ""):
            print(f"distkernel: rank {os.environ.get('RANK')}'s Ray node did not come up "
                  f"within Ray's start-up time (a busy node?); trying again ({attempt + 1} of "
                  f"{tries})", file=sys.stderr, flush=True)
            continue
        if done.stdout:
            print(done.stdout, end="" if done.stdout.endswith("\n") else "\n", flush=True)
        tried = f" (try {attempt} of {tries})" if tries > 1 else ""
        raise RuntimeError(f"`ray {' '.join(argv)}` failed with exit code {done.returncode}"
                           f" on rank {os.environ.get('RANK')}{tried}; its output is above")


class _Deferred:
    """SIGINT and SIGTERM noted, not acted on, while `ray stop` runs; `end()`
    puts the old handlers back and acts on what came: a KeyboardInterrupt for
    SIGINT (the rank unwinds as interrupted), the old disposition for SIGTERM
    (by default, the rank ends). Outside the main thread, where Python sets no
    handler, nothing is deferred."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.came = []
        self.old = {}

    def begin(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.old[sig] = signal.signal(sig, self._note)

    def _note(self, sig, _frame):
        self.came.append(sig)

    def end(self):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        if signal.SIGTERM in self.came:
            signal.raise_signal(signal.SIGTERM)
        if signal.SIGINT in self.came:
            raise KeyboardInterrupt


def _ray_stop(ran, watcher=None):
    """`ray stop`, out of reach of the signals that end the rank's group. RAN
    (a list) gets True once it has started: an interrupt that lands before
    the signals are deferred leaves it empty, one after they are acted on does
    not. WATCHER (a _Watcher) is told once it has started."""
    deferred = _Deferred()
    try:
        deferred.begin()
        proc = subprocess.Popen([ray_command(), "stop"], start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        ran.append(True)
        if watcher is not None:
            watcher.stopped()
        try:
            out, _ = proc.communicate(timeout=_STOP_TIMEOUT)
            if proc.returncode == 0:
                out = ""        # shown only when it failed, as `ray start`'s
        except subprocess.TimeoutExpired:
            out = f"`ray stop` still running after {_STOP_TIMEOUT} s; left to finish on its own\n"
        if out:
            print(out, end="" if out.endswith("\n") else "\n", flush=True)
    finally:
        deferred.end()


class _Watcher:
    """This rank's stand-in for its `ray stop` (see the top): a shell in a
    session of its own that runs `ray stop` when the rank ends without saying
    it has started its own. Its output goes nowhere: the rank that would show
    it is gone."""

    SCRIPT = 'read -r said; [ "$said" = stopped ] || exec "$0" stop'

    def __init__(self):
        read_end, self._write_end = os.pipe()
        try:
            self._proc = subprocess.Popen(
                ["/bin/sh", "-c", self.SCRIPT, ray_command()], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)

    def stopped(self):
        """The rank's own `ray stop` has started: the watcher leaves."""
        if self._write_end < 0:
            return
        try:
            os.write(self._write_end, b"stopped\n")
        except OSError:
            pass        # the watcher is gone: nothing to tell
        os.close(self._write_end)
        self._write_end = -1
        try:
            self._proc.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass


def _ray_version():
    """(major, minor) of the installed Ray, from `ray --version` ("ray, version
    2.52.0"), or None when it does not say."""
    try:
        done = subprocess.run([ray_command(), "--version"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace", timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"version (\d+)\.(\d+)", done.stdout or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def _secret(label):
    """The run's secret for LABEL (distkernel._backchannel.run_secret), or an
    error saying why there is none: outside distkernel's ranks nothing signs
    the head's address, and an unsigned one is what this module refuses."""
    from distkernel import _backchannel

    secret = _backchannel.run_secret(label)
    if secret is None:
        raise RuntimeError("ray_init() signs the Ray head's address with the run's key, and "
                           "this process is not a rank of distkernel's run (no key): start "
                           "Ray from a @distributed function or a %%distributed cell")
    return secret


def _signed_head(generation, address, mode):
    """What rank 0 publishes: "MAC ADDRESS MODE", MAC an HMAC of the rest."""
    body = f"{address} {mode}".encode()
    mac = _secret(b"ray/head/%d/" % generation + body).hex()
    return mac.encode() + b" " + body


def _verified_head(generation, value):
    """(address, mode) from what the store holds, or an error when rank 0 did
    not write it."""
    mac, _, body = value.partition(b" ")
    want = _secret(b"ray/head/%d/" % generation + body).hex().encode()
    address, _, mode = body.decode(errors="replace").partition(" ")
    if not hmac.compare_digest(mac, want) or mode not in ("token", "none"):
        shown = value[:120].decode(errors="replace")
        raise RuntimeError(
            f"rank {os.environ.get('RANK')} refuses the Ray head's address in the run's "
            f"rendezvous store ({shown!r}): it is not signed with the run's key, so rank 0 did "
            f"not write it; someone else who reached MASTER_ADDR:MASTER_PORT did. Not joining "
            f"it; the run is stopped")
    return address, mode


def _node_memory():
    """Bytes of memory this node gives the run: the machine's, or less where
    the rank's cgroup (a Slurm job's, a container's) has a limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        with open(f"/sys/fs/cgroup{path}/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except (OSError, StopIteration, IndexError):
        pass
    return total


def _node_share():
    """This rank's share of its node for its Ray node: every rank runs one
    (a raylet, its object store and agents), so LOCAL_WORLD_SIZE of them
    share the machine. Ray's defaults are each the whole machine's: all its
    CPUs, and an object store of 30% of its memory, in /dev/shm; eight
    ranks would promise 8x the CPUs and 240% of the memory. So each gets
    1/LOCAL_WORLD_SIZE of the CPUs this process may run on (at least 1),
    of 30% of the node's memory for its object store (at least Ray's
    minimum, 75 MiB) and of the rest for its tasks' `memory`."""
    local_world = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    memory = _node_memory() // local_world
    store = max(75 * 1024 * 1024, memory * 3 // 10)
    return {"cpus": max(1, cpus // local_world), "object_store": store,
            "memory": max(1, memory - store)}


def _started_key():
    """The counter this rank adds to once its `ray start` worked: its node's
    (GROUP_RANK) and its LOCAL_RANK."""
    return f"started/{os.environ.get('GROUP_RANK', '0')}/{os.environ.get('LOCAL_RANK', '0')}"


def _started_before():
    """The counter to wait for before this rank's `ray start`, or None. The
    ranks of one node start their Ray nodes a few at a time (a CPU for
    each 8, at least one): each `ray start` is some 5 s of CPU (the raylet,
    Ray's agents in Python, a first worker), and Ray gives a node 30 s to
    register before it calls its start failed, which four at once on two
    busy CPUs missed. Nodes start side by side; on a node of 96 CPUs and 8
    ranks, all at once."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    at_once = max(1, (os.cpu_count() or 1) // 8)
    if local < at_once:
        return None
    return f"started/{os.environ.get('GROUP_RANK', '0')}/{local - at_once}"


class RayCluster:
    """This rank's part of the run's Ray cluster (what ray_init() returns).

    `address` is the head's "host:port", also in RAY_ADDRESS; `is_driver` is
    true on rank 0, which runs the driver code. `stop()` (or leaving a `with`
    block) ends it: the driver says it is done, the other ranks wait for that,
    then each runs `ray stop`."""

    def __init__(self, num_cpus=None, num_gpus=None):
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.is_driver = self.rank == 0
        self.address = None
        self._stopped = False
        self._started = False   # this rank ran `ray start`: it must run `ray stop`
        self._joined = False    # ... and it worked: a worker then waits for the driver
        self._ray_stopped = []  # not empty once its `ray stop` has started (_ray_stop)
        self._watcher = None    # runs `ray stop` if this rank dies before it does (_Watcher)
        self._generation = len(_clusters)
        self._base, self._store = _store(self._generation)
        _clusters.append(self)
        try:
            self._start(num_cpus, num_gpus)
        except BaseException:
            self.stop()
            raise

    def _start_args(self, num_cpus, num_gpus):
        """What every `ray start` of the run is given: this rank's share of its
        node (see _node_share), no dashboard, no usage report."""
        share = _node_share()
        args = [f"--num-cpus={share['cpus'] if num_cpus is None else num_cpus}",
                f"--object-store-memory={share['object_store']}",
                f"--memory={share['memory']}", "--disable-usage-stats"]
        if num_gpus is not None:
            args.append(f"--num-gpus={num_gpus}")
        return args

    def _ray_env(self, num_gpus):
        """A GPU rank's Ray node owns the rank's GPU alone (the one of LOCAL_RANK)."""
        env = dict(os.environ)
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if num_gpus:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(local + 1)]
            env["CUDA_VISIBLE_DEVICES"] = ids[local] if local < len(ids) else str(local)
        return env

    def _auth_env(self, mode):
        """Ray's token authentication for this cluster: the variables every
        `ray start` and the driver read. The token is the run's secret, the
        same on every rank and never sent."""
        if mode != "token":
            return {}
        token = _secret(b"ray/token/%d" % self._generation).hex()
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}

    def _start(self, num_cpus, num_gpus):
        args = self._start_args(num_cpus, num_gpus)
        node_ip = _node_ip()
        if node_ip:
            args.append(f"--node-ip-address={node_ip}")
        env = self._ray_env(num_gpus)
        if self.is_driver:
            version = _ray_version()
            mode = "token" if version and version >= _TOKEN_AUTH_SINCE else "none"
            if mode == "none":
                said = "%d.%d" % version if version else "whose version `ray --version` did not say"
                print(f"distkernel: this Ray ({said}) has no authentication (Ray's token "
                      f"authentication came in {'%d.%d' % _TOKEN_AUTH_SINCE}): anyone who "
                      f"reaches this cluster's ports can run code in it as you",
                      file=sys.stderr, flush=True)
            env.update(self._auth_env(mode))
            host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            self._watcher = _Watcher()
            self._started = True
            # a port of its own each try: a failed try's GCS may hold the last one
            argv = _run_ray(lambda: ["start", "--head", f"--port={_free_port()}",
                                     "--include-dashboard=false", *args], env, _START_TRIES)
            port = next(a.split("=", 1)[1] for a in argv if a.startswith("--port="))
            self.address = f"{host}:{port}"
            self._store.set("head", _signed_head(self._generation, self.address, mode))
            self._store.add(_started_key(), 1)
            self._store.add("head_ready", 1)
            _wait(self._store, "joined", self.world - 1, _JOIN_TIMEOUT)
            print(f"distkernel: Ray cluster of {self.world} node{'s' if self.world > 1 else ''}"
                  f" at {self.address}", flush=True)
        else:
            if not _wait(self._store, "head_ready", 1, _JOIN_TIMEOUT):
                raise RuntimeError("rank 0 ended before starting the Ray head")
            before = _started_before()
            if before is not None and not _wait(self._store, before, 1, _JOIN_TIMEOUT):
                raise RuntimeError("the run ended before this rank's turn to join Ray")
            self.address, mode = _verified_head(self._generation, self._store.get("head"))
            env.update(self._auth_env(mode))
            self._watcher = _Watcher()
            self._started = True
            _run_ray(["start", f"--address={self.address}", *args], env, _START_TRIES)
            self._joined = True
            self._store.add(_started_key(), 1)
            self._store.add("joined", 1)
        os.environ.update(self._auth_env(mode))
        os.environ["RAY_ADDRESS"] = self.address

    def stop(self):
        if self._stopped:
            return
        self._stopped = True
        try:
            _disconnect()
            if self.is_driver:
                self._store.add("driver_done", 1)
            elif self._joined:
                _wait(self._store, "driver_done")
        finally:
            self._stop_ray()

    def _stop_ray(self):
        """This rank's `ray stop`, once, wherever an interrupt lands. The
        kernel's SIGINT can come just as a worker's wait ends (the driver's
        failure ends the run while its workers see it done), and land in
        _ray_stop before it holds the signals: `ray stop` is then run again,
        and the interrupt raised after it."""
        interrupted = None
        while self._started and not self._ray_stopped:
            try:
                _ray_stop(self._ray_stopped, self._watcher)
            except KeyboardInterrupt as e:
                if self._ray_stopped:
                    raise
                interrupted = e
        if interrupted is not None:
            raise interrupted

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def __repr__(self):
        role = "driver" if self.is_driver else "worker"
        return f"RayCluster(rank={self.rank}, {role}, address={self.address!r})"


def _disconnect():
    """`ray.shutdown()` where this process is connected (the driver's
    `ray.init()`), before the cluster is stopped under it: a driver still
    connected gets the stopped daemons' complaints in its output ("The
    autoscaler failed ... Terminated with signal 15")."""
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            ray.shutdown()
    except Exception as exc:   # noqa: BLE001 -- the stop goes on; say why it was noisy
        print(f"distkernel: ray.shutdown() before `ray stop` failed: {exc}", file=sys.stderr,
              flush=True)


def _stop_at_exit():
    for cluster in _clusters:
        try:
            cluster.stop()
        except BaseException:
            pass


def ray_init(num_cpus=None, num_gpus=None):
    """Start this run's Ray cluster from inside a distributed function or
    %%distributed cell, on every rank: rank 0 is the head and the driver, the
    others join it. Returns a RayCluster; use it as
    `with ray_init() as cluster: if cluster.is_driver: ...`. A worker's
    `stop()` (the end of the block, or of the rank) waits for the driver's."""
    if not _in_a_rank():
        raise RuntimeError("ray_init() starts Ray on the ranks of a distributed run: call it "
                           "inside a @distributed function or a %%distributed cell (or use "
                           "@ray_launch, which does it for you)")
    ray_command()
    if not _clusters:
        import atexit
        atexit.register(_stop_at_exit)
    return RayCluster(num_cpus=num_cpus, num_gpus=num_gpus)


def run_as_driver(fn, args, kwargs, gpu):
    """What each rank of a @ray_launch run does: its part of the cluster, and
    on rank 0 FN as the driver. Returns FN's value on rank 0, None elsewhere."""
    cluster = ray_init(num_gpus=1 if gpu else 0)
    try:
        if cluster.is_driver:
            return fn(*args, **kwargs)
        return None
    finally:
        cluster.stop()
