#!/usr/bin/python3
"""A stand-in for the `ray` command, for tests: Ray cannot be installed here.

Put first on the ranks' PATH as `ray` (tests/e2e/test_platform.py does). Each
invocation appends one JSON line to $FAKE_RAY_LOG: its arguments, the rank and
the variables Ray's CLI reads (RAY_ADDRESS, CUDA_VISIBLE_DEVICES), its pid and
process group and session, and a time, so a test can prove the order of starts
and stops. `ray start --head` and `ray start --address=...` print what Ray
prints and exit 0, as does `ray stop`; FAKE_RAY_FAIL=head (or worker) makes
that start fail with exit code 1, and FAKE_RAY_STOP_SLEEP=S makes `ray stop`
take S seconds (recorded again when it finishes), as a real one takes a few.
`ray --version` says FAKE_RAY_VERSION (default 2.52.0, the first Ray with token
authentication); RAY_AUTH_MODE and RAY_AUTH_TOKEN are recorded.

A stranger in the rendezvous: with FAKE_RAY_FORGE=HOST:PORT, `ray start --head`
first has another process (as user FAKE_RAY_FORGE_AS, when set) connect to the
run's store at MASTER_ADDR:MASTER_PORT, as anyone who reaches that port can,
and write HOST:PORT there as the head's address with the head said ready,
before rank 0 publishes its own; the head then waits (up to 30 s) for a
worker to join the forged address, so that a worker that believes the store
reads the stranger's value.
"""
import json
import os
import pwd
import subprocess
import sys
import time


def record(event, **extra):
    entry = {"event": event, "argv": sys.argv[1:], "rank": os.environ.get("RANK"),
             "RAY_ADDRESS": os.environ.get("RAY_ADDRESS"),
             "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE"),
             "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN"),
             "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
             "time": time.time(), **extra}
    fd = os.open(os.environ["FAKE_RAY_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())   # one write: lines never mix
    finally:
        os.close(fd)


STORE_PREFIX = "distkernel/ray/0/"     # distkernel._ray's keys of a run's first cluster


def forge(host, port, head):
    """As the stranger: write HEAD into the store at HOST:PORT as the head's address."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.PrefixStore(STORE_PREFIX, dist.TCPStore(host, int(port), is_master=False,
                                                         timeout=timedelta(seconds=20)))
    store.set("head", head)
    store.add("started/0/0", 1)     # the head's turn done: ranks after it on its node go on
    store.add("head_ready", 1)
    return 0


def forge_then_wait(head):
    argv = [sys.executable, os.path.realpath(__file__), "forge", os.environ["MASTER_ADDR"],
            os.environ["MASTER_PORT"], head]
    who = os.environ.get("FAKE_RAY_FORGE_AS")
    if who:
        pw = pwd.getpwnam(who)
        argv = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
                *argv]
    subprocess.run(argv, check=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(os.environ["FAKE_RAY_LOG"]) as f:
            if any(f"--address={head}" in json.loads(line)["argv"] for line in f):
                return
        time.sleep(0.1)


def main():
    args = sys.argv[1:]
    command = args[0] if args else ""
    if command == "forge":
        return forge(*args[1:])
    record(command)
    if command == "--version":
        print(f"ray, version {os.environ.get('FAKE_RAY_VERSION', '2.52.0')}")
        return 0
    if command == "start":
        head = "--head" in args
        if head and os.environ.get("FAKE_RAY_FORGE"):
            forge_then_wait(os.environ["FAKE_RAY_FORGE"])
        if os.environ.get("FAKE_RAY_FAIL") == ("head" if head else "worker"):
            print("fake ray: start failed (FAKE_RAY_FAIL)", file=sys.stderr)
            return 1
        print("Ray runtime started." if head else "Ray runtime started (worker).")
        return 0
    if command == "stop":
        delay = float(os.environ.get("FAKE_RAY_STOP_SLEEP", "0"))
        if delay:
            time.sleep(delay)
            record("stopped")
        print("Stopped all 0 Ray processes.")
        return 0
    print(f"fake ray: unsupported command {args!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
