"""
Two unprivileged users on one machine, for the tests of what one user can do to
another's kernel ("safe on a shared machine"): `dkvictim` runs a kernel, `dkattacker`
shares its /tmp and tries to read or redirect what the kernel writes.

CI runs the tests as root, which is what creating users needs; as anyone else every
test that uses them is skipped with the reason. The users are created once with
useradd (home directories under /home, no password, no login shell needed) and kept:
creating them again is a no-op, and a second test run finds them as they are.

    victim, attacker = users.pair()              # skips unless root
    users.run_as(attacker, ["ln", "-s", ...])    # a command as that user
    k = users.start_kernel(victim, env={...})    # a support.Kernel owned by victim

How a kernel is started as another user. The test process (root) keeps the
jupyter_client KernelManager, so the suite's usual `support.Kernel` drives it. The
connection file is written by the manager into a directory the victim owns and then
given to the victim (chown), since the kernel opens it as the victim; the kernel itself
is started through `setpriv`, which changes uid, gid and supplementary groups and then
execs in place, so the process the manager watches, interrupts and kills is the
kernel itself (runuser would sit between them as a parent). Its environment is the one
a login would give that user: HOME, USER, LOGNAME, SHELL, PATH, no TMPDIR (so /tmp,
shared with the attacker), no XDG_* unless the test passes them, and the DISTKERNEL_*
variables of the test run (DISTKERNEL_FAKE_CUDA ...) but not DISTKERNEL_LOG_DIR, and
ASAN_OPTIONS and the like for a sanitized build.

The installed prefix (DISTKERNEL_PREFIX) must be readable by the victim: every
directory above it needs o+x and the installed files o+r (meson installs 0755/0644
under the default umask). `prefix_problem()` checks this by asking the victim itself
(`test -x` / `test -r` as that user), and the fixtures skip with the path at fault
rather than fail in an unreadable way; if /work is 0700 on a CI machine, `chmod o+x`
on the directories above the prefix (search only, not listing) is enough.
"""
import json
import os
import pathlib
import pwd
import shutil
import subprocess
import tempfile

import pytest

import support

VICTIM = "dkvictim"
ATTACKER = "dkattacker"
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
USERADD = shutil.which("useradd") or "/usr/sbin/useradd"


class User:
    """An unprivileged account: name, uid, gid, home."""

    def __init__(self, name):
        pw = pwd.getpwnam(name)
        self.name = name
        self.uid = pw.pw_uid
        self.gid = pw.pw_gid
        self.home = pathlib.Path(pw.pw_dir)

    def __repr__(self):
        return f"User({self.name}, uid={self.uid})"

    def env(self, **extra):
        """The environment a login would give this user, plus EXTRA (None unsets)."""
        env = {
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "SHELL": "/bin/sh",
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
        return env


def why_not():
    """The reason users cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to create the test users dkvictim and dkattacker (CI runs as root)"
    for tool in (SETPRIV, USERADD):
        if not os.access(tool, os.X_OK):
            return f"{tool} is missing (util-linux / passwd)"
    return None


def ensure(name):
    """Create NAME (with a home directory) unless it exists; return its User."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        r = subprocess.run([USERADD, "--create-home", "--shell", "/bin/sh", "--user-group", name],
                           capture_output=True, text=True)
        # Two test processes may race to create it: what counts is that it exists.
        if r.returncode != 0:
            try:
                pwd.getpwnam(name)
            except KeyError:
                raise RuntimeError(f"useradd {name} failed: {r.stderr.strip()}") from None
    user = User(name)
    if not user.home.is_dir():
        user.home.mkdir(parents=True, mode=0o750)
        os.chown(user.home, user.uid, user.gid)
    return user


def pair():
    """(victim, attacker), created if needed; skips the test when that cannot be done."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    return ensure(VICTIM), ensure(ATTACKER)


def _setpriv(user):
    return [SETPRIV, f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--"]


def run_as(user, argv, env=None, check=False, **kw):
    """subprocess.run(ARGV) as USER (its login environment unless ENV), text mode,
    output captured unless KW says otherwise."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("cwd", str(user.home))
    return subprocess.run(_setpriv(user) + list(argv), env=env if env is not None else user.env(),
                          check=check, **kw)


def popen_as(user, argv, env=None, **kw):
    """subprocess.Popen(ARGV) as USER."""
    kw.setdefault("cwd", str(user.home))
    return subprocess.Popen(_setpriv(user) + list(argv),
                            env=env if env is not None else user.env(), **kw)


def kernel_binary():
    spec = json.loads((support.KERNELSPEC_DIR / "kernel.json").read_text())
    return spec["argv"][0]


def prefix_problem(user):
    """Why USER cannot run the installed kernel, or None."""
    binary = kernel_binary()
    p = pathlib.Path(binary)
    for d in [*reversed(p.parents)]:
        if run_as(user, ["test", "-x", str(d)]).returncode != 0:
            return (f"{user.name} cannot enter {d} (on the way to {binary}): give the "
                    f"directories above DISTKERNEL_PREFIX o+x")
    if run_as(user, [binary, "--version"]).returncode not in (0, 1, 2):
        return f"{user.name} cannot run {binary}"
    if run_as(user, ["test", "-r", str(support.KERNELSPEC_DIR / "kernel.json")]).returncode:
        return f"{user.name} cannot read the installed files under {support.PREFIX}"
    return None


def test_env():
    """Variables of this test run that a kernel under test should see: DISTKERNEL_*
    (but not DISTKERNEL_LOG_DIR) and the sanitizers' *SAN_OPTIONS."""
    return {k: v for k, v in os.environ.items()
            if (k.startswith("DISTKERNEL_") or k.endswith("SAN_OPTIONS"))
            and k not in ("DISTKERNEL_LOG_DIR", "DISTKERNEL_PREFIX")}


def private_dir(user, parent=None, prefix="dk-test-"):
    """A fresh 0700 directory owned by USER (under its home by default)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=str(parent or user.home)))
    os.chown(d, user.uid, user.gid)
    return d


def start_kernel(user, env=None, ready_timeout=30, stderr=None):
    """A support.Kernel whose kernel process runs as USER, in its home, with its login
    environment plus the run's DISTKERNEL_* variables plus ENV (None values unset).
    Skips when USER cannot read the installed prefix."""
    reason = prefix_problem(user)
    if reason:
        pytest.skip(reason)
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpec

    conn_dir = private_dir(user, prefix=".dk-conn-")
    # cache_ports=False: otherwise the provisioner picks new ports and rewrites the
    # file, as root, after it was given to the user.
    km = KernelManager(kernel_name="distkernel", cache_ports=False,
                       connection_file=str(conn_dir / "kernel.json"))
    spec = json.loads((support.KERNELSPEC_DIR / "kernel.json").read_text())
    spec["argv"] = _setpriv(user) + spec["argv"]
    km._kernel_spec = KernelSpec(resource_dir=str(support.KERNELSPEC_DIR), **spec)
    km.write_connection_file()
    os.chown(km.connection_file, user.uid, user.gid)
    full_env = user.env(**test_env())
    for k, v in (env or {}).items():
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = str(v)
    launch = {"env": full_env, "cwd": str(user.home)}
    if stderr is not None:
        launch["stderr"] = stderr
    k = support.Kernel.launch(km, ready_timeout, **launch)
    k.conn_dir = conn_dir
    return k


def stop_kernel(k):
    """Stop a kernel from start_kernel and remove its connection directory."""
    try:
        k.stop()
    finally:
        shutil.rmtree(getattr(k, "conn_dir", ""), ignore_errors=True)
