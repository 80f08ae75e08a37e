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
"""
import json
import os
import sys
import time


def record(event, **extra):
    entry = {"event": event, "argv": sys.argv[1:], "rank": os.environ.get("RANK"),
             "RAY_ADDRESS": os.environ.get("RAY_ADDRESS"),
             "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
             "time": time.time(), **extra}
    fd = os.open(os.environ["FAKE_RAY_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())   # one write: lines never mix
    finally:
        os.close(fd)


def main():
    args = sys.argv[1:]
    command = args[0] if args else ""
    record(command)
    if command == "start":
        head = "--head" in args
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
