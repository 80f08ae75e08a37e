"""
The test users of users.py work: two distinct unprivileged accounts, commands run as
each, and a kernel driven by jupyter_client that runs as the victim with a login's
environment. Skipped, with the reason, when not run as root.
"""
import os

import users


def test_two_distinct_unprivileged_users():
    victim, attacker = users.pair()
    assert victim.uid != 0 and attacker.uid != 0 and victim.uid != attacker.uid
    assert users.run_as(victim, ["id", "-u"]).stdout.strip() == str(victim.uid)
    assert users.run_as(attacker, ["id", "-u"]).stdout.strip() == str(attacker.uid)
    # Creating them again is a no-op.
    assert users.ensure(users.VICTIM).uid == victim.uid


def test_one_user_cannot_read_the_others_private_file():
    victim, attacker = users.pair()
    d = users.private_dir(victim)
    try:
        secret = d / "secret"
        r = users.run_as(victim, ["sh", "-c", f"echo hidden > {secret}"])
        assert r.returncode == 0, r.stderr
        assert users.run_as(attacker, ["cat", str(secret)]).returncode != 0
    finally:
        users.run_as(victim, ["rm", "-rf", str(d)])


def test_kernel_runs_as_the_victim_with_a_login_environment():
    victim, _ = users.pair()
    k = users.start_kernel(victim)
    try:
        ex = k.execute("import os, tempfile; print(os.getuid(), os.environ['HOME'], "
                       "os.environ.get('TMPDIR'), tempfile.gettempdir(), os.getcwd())")
        assert ex.status == "ok", ex.describe()
        assert ex.stdout.split() == [str(victim.uid), str(victim.home), "None", "/tmp",
                                     str(victim.home)]
        assert os.stat(f"/proc/{k.pid}").st_uid == victim.uid
        ex = k.execute("%%distributed num_processes=2 tracking=False\n"
                       "import os\nos.getuid()", timeout=120)
        assert ex.status == "ok", ex.describe()
        assert str(victim.uid) in (ex.result or ""), ex.describe()
    finally:
        users.stop_kernel(k)
