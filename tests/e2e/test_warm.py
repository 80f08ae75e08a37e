"""Warm start: a fresh run's ranks forked from the kernel's template, which has
imported torch already (runtime/launch/dk_template.h, distributed/dk_dist_warm.h).

A warm run must be a fresh run in every way the user can see: the same values,
environment, working directory and sys.path as a cold one (warm=False), the
same failures (root cause, crash signal, interrupt, timeout), and nothing left
when the kernel is SIGKILLed. The tests also check that the ranks really came
from the template (so that a silent fallback to cold fails them), that the
template is rebuilt when what it was built from changes, and that a template
that cannot fork safely (a module started a thread) makes runs cold with the
reason in the run's warm.log. No timing is asserted (bench/warm_bench.py).
"""
import ast
import json
import os
import re
import signal
import time

import psutil
import pytest

import support
from support import NoReply

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%distributed is distkernel's")

RUN = 180        # seconds a cell may take on a busy machine (the first builds the template)
END_WITHIN = 10

# What a rank reports of itself; TORCH_FIRST is whether torch was imported
# before the cell's first line (only a warm rank has it).
PROBE = """%%distributed num_processes=2 tracking=False {opts}
import sys
TORCH_FIRST = 'torch' in sys.modules
import json, os
env = {{k: v for k, v in os.environ.items()
       if k not in ('MASTER_PORT', 'TORCHELASTIC_RUN_ID', 'DISTKERNEL_LOG')}}
json.dumps({{'env': env, 'cwd': os.getcwd(), 'path': sys.path, 'ppid': os.getppid(),
            'pid': os.getpid(), 'pgid': os.getpgrp(), 'torch_first': TORCH_FIRST,
            'port': os.environ['MASTER_PORT'], 'value': sum(range(10 ** 5)) + int(os.environ['RANK'])}})
"""


def probe(kernel, opts=""):
    r = kernel.execute(PROBE.format(opts=opts), timeout=RUN)
    assert r.status == "ok", r.describe()
    ranks = {}
    for m in re.finditer(r"^rank (\d+): '(.*)'$", r.result, re.M):
        ranks[int(m.group(1))] = json.loads(m.group(2).encode().decode("unicode_escape"))
    assert sorted(ranks) == [0, 1], r.describe()
    return ranks


def template_of(kernel):
    """The kernel's template: its child running distkernel-rank with
    DISTKERNEL_TEMPLATE in its environment."""
    found = []
    for p in psutil.Process(kernel.pid).children():
        try:
            if "DISTKERNEL_TEMPLATE" in p.environ():
                found.append(p.pid)
        except psutil.Error:
            pass
    assert len(found) <= 1, found
    return found[0] if found else None


def assert_warm(kernel, ranks):
    template = template_of(kernel)
    assert template, "no template runs"
    for rank, info in ranks.items():
        assert info["torch_first"], f"rank {rank} did not come from the template: {info}"
        assert info["ppid"] == template, (rank, info["ppid"], template)


def test_a_warm_run_is_a_fresh_run_with_the_cold_runs_environment(kernel):
    warm = probe(kernel)
    warm = probe(kernel)          # the first may have built the template
    assert_warm(kernel, warm)
    cold = probe(kernel, "warm=False")
    for rank in (0, 1):
        w, c = warm[rank], cold[rank]
        assert not c["torch_first"] and c["ppid"] == kernel.pid, c
        assert w["value"] == c["value"] == sum(range(10 ** 5)) + rank
        assert w["env"] == c["env"], set(w["env"].items()) ^ set(c["env"].items())
        for name, want in (("RANK", str(rank)), ("LOCAL_RANK", str(rank)), ("WORLD_SIZE", "2"),
                           ("MASTER_ADDR", "127.0.0.1")):
            assert w["env"][name] == want
        assert "DISTKERNEL_WARM_SOCKET" not in w["env"] and "DISTKERNEL_TEMPLATE" not in w["env"]
        assert w["cwd"] == c["cwd"] and w["path"] == c["path"]
        # Its own process, leading its own group (and session), as a cold
        # rank does; one port for both ranks.
        assert w["pid"] != w["ppid"] and w["pgid"] == w["pid"] and c["pgid"] == c["pid"]
    assert warm[0]["port"] == warm[1]["port"]
    assert warm[0]["pgid"] != warm[1]["pgid"]


# What a rank says its names are: the process name and argv[0].
NAME_CELL = """%%distributed num_processes=2 tracking=False
import sys
TORCH_FIRST = 'torch' in sys.modules
(open('/proc/self/comm').read().strip(),
 open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].decode(), TORCH_FIRST)
"""


def test_the_template_is_named_for_what_it_is_and_shown_with_its_memory(kernel):
    r = kernel.execute(NAME_CELL, timeout=RUN)
    assert r.status == "ok", r.describe()
    # Its ranks keep the rank's name: they are what a count of ranks should find.
    assert r.result == ("rank 0: ('distkernel-rank', 'distkernel-rank', True)\n"
                        "rank 1: ('distkernel-rank', 'distkernel-rank', True)"), r.describe()
    template = psutil.Process(template_of(kernel))
    assert template.name() == "distkernel-tmpl"
    assert template.cmdline()[0] == "distkernel-template", template.cmdline()
    s = kernel.execute("%distributed status", timeout=30)
    assert s.status == "ok", s.describe()
    m = re.search(r"^warm-start template: distkernel-template \(pid (\d+)\), "
                  r"([\d.]+) MiB resident", s.stdout, re.M)
    assert m and int(m.group(1)) == template.pid, s.describe()
    rss_mib = template.memory_info().rss / 2 ** 20
    assert rss_mib / 2 < float(m.group(2)) < rss_mib * 2, (m.group(2), rss_mib)


# Every process of the rank's group, and the kernel's child that writes to
# the rank's stdout pipe (a warm rank's stub, which waits for it and passes
# the job's stops on; a cold rank is that child itself): what of the back
# channel's key their /proc/PID/environ shows.
KEY_CELL = """%%distributed num_processes=2 tracking=False {opts}
import os, re, sys
seen = []
out = os.readlink('/proc/self/fd/1')
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    try:
        stat = open(f'/proc/{{pid}}/stat').read()
        ppid, pgrp = (int(f) for f in stat.rsplit(')', 1)[1].split()[1:3])
        if pgrp != os.getpgrp() and not (ppid == {kernel} and
                                         os.readlink(f'/proc/{{pid}}/fd/1') == out):
            continue
        environ = open(f'/proc/{{pid}}/environ', 'rb').read()
    except (OSError, ValueError, IndexError):
        continue
    seen.append((int(pid), re.findall(rb'DISTKERNEL_BC_KEY=([0-9a-fA-F]+)', environ)))
print(sorted(seen), 'torch' in sys.modules, os.getpid())
"""


@pytest.mark.parametrize("opts", ["", "warm=False"])
def test_no_rank_process_shows_the_key_in_its_proc_environ(kernel, opts):
    cell = KEY_CELL.format(opts=opts, kernel=kernel.pid)
    kernel.execute(cell, timeout=RUN)   # the first may build the template
    r = kernel.execute(cell, timeout=RUN)
    assert r.status == "ok", r.describe()
    lines = re.findall(r"^\[rank (\d)\] (\[.*\]) (True|False) (\d+)$", r.stdout, re.M)
    assert sorted(int(rank) for rank, *_ in lines) == [0, 1], r.describe()
    for rank, seen, warm, pid in lines:
        seen = ast.literal_eval(seen)   # [(pid, [hex, ...]), ...] printed by the rank
        pids = [p for p, _ in seen]
        assert int(pid) in pids, r.describe()
        # Warm: the rank and its stub; cold: the rank.
        assert len(pids) == (2 if opts == "" else 1), (pids, r.describe())
        assert (warm == "True") == (opts == ""), r.describe()
        assert all(found == [] for _, found in seen), (rank, seen)


def test_the_template_is_rebuilt_when_the_environment_cwd_or_path_change(kernel, tmp_path):
    cwd = probe(kernel)[0]["cwd"]
    probe(kernel)
    before = template_of(kernel)
    assert before
    same = probe(kernel)
    assert template_of(kernel) == before
    assert_warm(kernel, same)
    for change, check in (
            ("import os; os.environ['WARM_TEST_VAR'] = 'changed'",
             lambda info: info["env"].get("WARM_TEST_VAR") == "changed"),
            (f"import os; os.chdir({str(tmp_path)!r})",
             lambda info: info["cwd"] == str(tmp_path)),
            ("import sys; sys.path.append('/warm-test-path')",
             lambda info: "/warm-test-path" in info["path"])):
        r = kernel.execute(change)
        assert r.status == "ok", r.describe()
        ranks = probe(kernel)
        now = template_of(kernel)
        assert now and now != before, f"the template was not rebuilt after {change!r}"
        assert_warm(kernel, ranks)
        assert all(check(info) for info in ranks.values()), (change, ranks)
        assert not psutil.pid_exists(before) or \
            psutil.Process(before).status() == psutil.STATUS_ZOMBIE, "the stale template runs on"
        before = now
    kernel.execute("import os, sys; os.environ.pop('WARM_TEST_VAR'); "
                   "sys.path.remove('/warm-test-path')")
    kernel.execute(f"os.chdir({cwd!r})")


# The first line of a cell that must run warm: a silent fallback to cold
# prints False.
WARM_LINE = "import sys\nprint('warm', 'torch' in sys.modules, flush=True)\n"


def assert_ran_warm(r):
    assert "[rank 0] warm True" in r.stdout and "[rank 1] warm True" in r.stdout, r.describe()


def test_failures_on_warm_ranks_are_reported_as_on_cold_ones(kernel):
    assert_warm(kernel, probe(kernel))
    r = kernel.execute("%%distributed num_processes=2 tracking=False\n" + WARM_LINE +
                       "import os, time\ntime.sleep(1)\n"
                       "if os.environ['RANK'] == '1':\n    raise ValueError('warm root cause')\n"
                       "time.sleep(60)", timeout=RUN)
    assert r.status == "error" and "warm root cause" in r.content["evalue"], r.describe()
    assert "rank 1" in r.content["evalue"], r.describe()
    assert_ran_warm(r)
    r = kernel.execute("%%distributed num_processes=2 tracking=False\n" + WARM_LINE +
                       "import os, signal, time\ntime.sleep(1)\n"
                       "if os.environ['RANK'] == '0':\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
                       "time.sleep(60)", timeout=RUN)
    assert r.status == "error", r.describe()
    text = r.content["evalue"] + "\n".join(r.content.get("traceback", []))
    assert "SIGSEGV" in text or "signal 11" in text, r.describe()
    assert_ran_warm(r)
    r = kernel.execute("%%distributed num_processes=2 tracking=False timeout=3\n" + WARM_LINE +
                       "import time\ntime.sleep(60)", timeout=RUN)
    assert r.content.get("ename") == "TimeoutError", r.describe()
    assert_ran_warm(r)


def test_an_interrupt_ends_warm_ranks_with_keyboardinterrupt(kernel):
    assert_warm(kernel, probe(kernel))
    msg_id = kernel.start_execute("%%distributed num_processes=2 tracking=False\n"
                                  "print('spinning', flush=True)\nwhile True:\n    pass\n")
    kernel.wait_iopub(lambda m: m["msg_type"] == "stream" and
                      m["parent_header"].get("msg_id") == msg_id and
                      "[rank 1] spinning" in m["content"]["text"], timeout=RUN)
    time.sleep(0.3)
    kernel.km.interrupt_kernel()
    try:
        reply = kernel.reply(msg_id, timeout=END_WITHIN)
    except NoReply:
        kernel.restart_now()
        pytest.fail(f"the cell still ran {END_WITHIN} s after the interrupt")
    r = kernel.finish(msg_id, reply=reply)
    assert r.status == "error" and "KeyboardInterrupt" in (r.content["ename"] +
                                                           r.content["evalue"]), r.describe()
    # Only the template is left.
    assert template_of(kernel)
    assert support.wait_no_descendants(kernel.pid, timeout=END_WITHIN) == []


def test_sigkill_of_the_kernel_leaves_no_template_and_no_rank(fresh_kernel):
    k = fresh_kernel
    assert_warm(k, probe(k))
    template = template_of(k)
    # Each rank leads a session of its own, with a child in it: the
    # template ends those groups when the kernel's end ends it (SIGTERM, its
    # parent-death signal).
    msg_id = k.start_execute("%%distributed num_processes=2 tracking=False\n"
                             "import os, subprocess, time\n"
                             "child = subprocess.Popen(['sleep', '300'])\n"
                             "print('pid', os.getpid(), flush=True)\n"
                             "time.sleep(300)")
    k.wait_iopub(lambda m: m["msg_type"] == "stream" and
                 m["parent_header"].get("msg_id") == msg_id and
                 "[rank 1] pid" in m["content"]["text"], timeout=RUN)
    everything = [p.pid for p in support.descendants(k.pid, template=True)]
    # the template, 2 stubs, 2 ranks, their 2 children
    assert template in everything and len(everything) >= 7, everything
    os.kill(k.pid, signal.SIGKILL)
    k.process.wait(timeout=10)
    assert support.wait_gone(everything, timeout=END_WITHIN) == []


def test_a_warm_module_that_starts_a_thread_makes_the_run_cold_and_says_why(fresh_kernel,
                                                                           tmp_path):
    k = fresh_kernel
    (tmp_path / "warm_threaded_mod.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    r = k.execute(f"import sys; sys.path.insert(0, {str(tmp_path)!r})")
    assert r.status == "ok", r.describe()
    ranks = probe(k, "warm_modules=warm_threaded_mod")
    for info in ranks.values():
        assert not info["torch_first"] and info["ppid"] == k.pid, info
    r = k.execute("%%distributed num_processes=1 tracking=False warm_modules=warm_threaded_mod\n"
                  "import os\nos.environ['DISTKERNEL_LOG']", timeout=RUN)
    assert r.status == "ok", r.describe()
    log_dir = os.path.dirname(re.search(r"'(.*)'", r.result).group(1))
    with open(os.path.join(log_dir, "warm.log")) as f:
        why = f.read()
    assert "started cold" in why and "threads" in why and "warm module" in why, why
    assert "warm.log" not in r.stdout + r.stderr and "cold" not in r.stdout + r.stderr, \
        r.describe()


def log_dir_of(kernel):
    """The log folder of a fresh one-rank run (cold, as the kernel decides)."""
    r = kernel.execute("%%distributed num_processes=1 tracking=False\n"
                       "import os\nos.environ['DISTKERNEL_LOG']", timeout=RUN)
    assert r.status == "ok", r.describe()
    return os.path.dirname(re.search(r"'(.*)'", r.result).group(1))


def test_warm_false_and_distkernel_warm_0_start_no_template(kernelspec_installed):
    k = support.Kernel.start(env=support.kernel_env(DISTKERNEL_WARM="0"))
    try:
        ranks = probe(k)
        assert all(not i["torch_first"] and i["ppid"] == k.pid for i in ranks.values())
        # The user's switch reaches the ranks as set; no rank tried a template.
        assert all(i["env"].get("DISTKERNEL_WARM") == "0" for i in ranks.values()), ranks
        with open(os.path.join(log_dir_of(k), "warm.log")) as f:
            why = f.read()
        assert why == "the ranks started cold: warm start is off (DISTKERNEL_WARM=0)\n", why
        assert template_of(k) is None
        ranks = probe(k, "warm=True")
        assert template_of(k) is None
    finally:
        k.stop()


def test_the_kernels_own_messages_go_to_its_log_never_into_the_cell(kernelspec_installed,
                                                                     tmp_path):
    # DISTKERNEL_DEBUG says why ranks start cold while the cell runs, when the
    # process's fd 2 is the cell's captured stderr: the line goes to the
    # kernel's log (its original stderr, runtime/base/dk_log.h), and the
    # cell shows only what the ranks and the run said.
    log = tmp_path / "kernel-stderr.log"
    with open(log, "w") as err:
        k = support.Kernel.start(env=support.kernel_env(DISTKERNEL_WARM="0",
                                                        DISTKERNEL_DEBUG="1"), stderr=err)
    try:
        r = k.execute("%%distributed num_processes=1 tracking=False\nprint('from the rank')",
                      timeout=RUN)
        assert r.status == "ok", r.describe()
        assert "[rank 0] from the rank" in r.stdout, r.describe()
        assert "start cold" not in r.stderr and "[distkernel] " not in r.stderr, r.stderr
    finally:
        k.stop()
    text = log.read_text(errors="replace")
    assert "[distkernel] ranks start cold: warm start is off (DISTKERNEL_WARM=0)" in text, text


def test_distkernel_warm_torch_0_forks_ranks_from_a_template_without_torch(kernelspec_installed):
    k = support.Kernel.start(env=support.kernel_env(DISTKERNEL_WARM_TORCH="0"))
    try:
        ranks = probe(k)
        template = template_of(k)
        assert template, "no template runs"
        # Forked from the template, which imported no torch; a cell that uses
        # torch still can.
        assert all(not i["torch_first"] and i["ppid"] == template for i in ranks.values()), ranks
        assert "torch" not in psutil.Process(template).environ()["DISTKERNEL_WARM_MODULES"]
        r = k.execute("%%distributed num_processes=2 tracking=False\n"
                      "import torch\nint(torch.ones(2).sum())", timeout=RUN)
        assert r.status == "ok" and r.result == "rank 0: 2\nrank 1: 2", r.describe()
        assert template_of(k) == template
    finally:
        k.stop()


def test_a_kernel_that_runs_no_distributed_cell_starts_no_template(fresh_kernel):
    k = fresh_kernel
    r = k.execute("1 + 1")
    assert r.status == "ok"
    assert template_of(k) is None
    probe(k, "warm=False")
    assert template_of(k) is None


def test_the_template_holds_no_cuda_library_on_a_gpu_node_model(tmp_path_factory):
    built = os.path.abspath(os.environ.get("DISTKERNEL_FAKE_CUDA", ""))
    assert os.environ.get("DISTKERNEL_FAKE_CUDA"), \
        "DISTKERNEL_FAKE_CUDA must name the folder holding the fake CUDA libraries"
    libs = tmp_path_factory.mktemp("fake-cuda")
    for name, source in {"libnvidia-ml.so.1": "libfake_nvml.so",
                         "libcudart.so.13": "libfake_cudart.so",
                         "libnccl.so.2": "libfake_nccl.so"}.items():
        os.symlink(os.path.join(built, source), libs / name)
    env = support.kernel_env(LD_LIBRARY_PATH=str(libs), FAKE_GPUS="2", CUDA_VISIBLE_DEVICES=None,
                             DISTKERNEL_CUDART_LIB=str(libs / "libcudart.so.13"),
                             DISTKERNEL_NCCL_LIB=str(libs / "libnccl.so.2"))
    k = support.Kernel.start(env=env)
    try:
        cell = ("%%distributed num_accelerators=2 tracking=False {}\nimport sys, os\n"
                "('torch' in sys.modules, os.environ.get('CUDA_VISIBLE_DEVICES'), "
                "os.environ.get('LOCAL_RANK'))")
        r1 = k.execute(cell.format(""), timeout=RUN)
        r2 = k.execute(cell.format(""), timeout=RUN)
        cold = k.execute(cell.format("warm=False"), timeout=RUN)
        assert r2.status == "ok" and cold.status == "ok", (r1.describe(), r2.describe(),
                                                           cold.describe())
        template = template_of(k)
        assert template
        assert r2.result.replace("(True,", "(X,") == cold.result.replace("(False,", "(X,"), \
            (r2.result, cold.result)
        assert "(True," in r2.result, r2.describe()
        with open(f"/proc/{template}/maps") as f:
            maps = f.read()
        for lib in ("libcudart", "libcuda.so", "libnvidia-ml", "libnccl", "libfake_"):
            assert lib not in maps, f"the template loaded {lib}"
    finally:
        k.stop()


def test_warm_rank_0_keeps_the_process_groups_store_until_every_rank_has_left(kernel):
    """Rank 0 hosts the env:// TCPStore. A warm rank exits at once (no
    interpreter teardown), so without a hold a peer still using the store
    (init_process_group does, after its barrier) got "Connection reset by
    peer" in a few runs of ten with 8 ranks."""
    assert_warm(kernel, probe(kernel))
    r = kernel.execute("%%distributed num_processes=2 tracking=False\n"
                       "import os, time, torch.distributed as dist\n"
                       "from torch.distributed import distributed_c10d\n"
                       "dist.init_process_group('gloo')\n"
                       "if dist.get_rank() == 1:\n"
                       "    time.sleep(2)\n"
                       "    distributed_c10d._get_default_store().set('late', '1')\n"
                       "dist.get_rank()", timeout=RUN)
    assert r.status == "ok", r.describe()


def test_a_template_that_ended_is_replaced_by_the_next_run(kernel):
    assert_warm(kernel, probe(kernel))
    before = template_of(kernel)
    os.kill(before, signal.SIGKILL)
    assert support.wait_gone([before], timeout=END_WITHIN) == []
    ranks = probe(kernel)
    assert template_of(kernel) not in (None, before)
    assert_warm(kernel, ranks)


def warm_log_of(kernel, modules):
    """What the run's warm.log says, for a one-rank run with MODULES warm."""
    r = kernel.execute(f"%%distributed num_processes=1 tracking=False warm_modules={modules}\n"
                       "import os\nos.environ['DISTKERNEL_LOG']", timeout=RUN)
    assert r.status == "ok", r.describe()
    log_dir = os.path.dirname(re.search(r"'(.*)'", r.result).group(1))
    try:
        with open(os.path.join(log_dir, "warm.log")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def test_a_warm_module_that_loads_the_cuda_driver_makes_the_run_cold(fresh_kernel, tmp_path):
    """torch.cuda.is_available() runs cuInit yet leaves is_initialized() False:
    a template holding the driver would hand every rank a broken CUDA. The
    driver here is the fake one, copied (so /proc/self/maps names it
    libcuda.so.1) and loaded with ctypes at import."""
    k = fresh_kernel
    built = os.path.abspath(os.environ.get("DISTKERNEL_FAKE_CUDA", ""))
    assert os.environ.get("DISTKERNEL_FAKE_CUDA"), \
        "DISTKERNEL_FAKE_CUDA must name the folder holding the fake CUDA libraries"
    import shutil
    shutil.copy(os.path.join(built, "libfake_cudart.so"), tmp_path / "libcuda.so.1")
    (tmp_path / "warm_cuda_mod.py").write_text(
        f"import ctypes\nctypes.CDLL({str(tmp_path / 'libcuda.so.1')!r})\n")
    r = k.execute(f"import sys; sys.path.insert(0, {str(tmp_path)!r})")
    assert r.status == "ok", r.describe()
    ranks = probe(k, "warm_modules=warm_cuda_mod")
    for info in ranks.values():
        assert not info["torch_first"] and info["ppid"] == k.pid, info
    why = warm_log_of(k, "warm_cuda_mod")
    assert "started cold" in why and "libcuda.so.1" in why and "warm module" in why, why
    # The template itself was asked to use NVML for is_available().
    template = template_of(k)
    assert template
    assert psutil.Process(template).environ().get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"


def test_a_warm_module_that_prints_a_banner_at_import_runs_warm(fresh_kernel, tmp_path):
    """The template says "ready" on its stdout: 200 bytes printed before it
    once hid it, and every run waited for the template and went cold."""
    k = fresh_kernel
    (tmp_path / "warm_banner_mod.py").write_text("print('banner ' * 40)\n")
    r = k.execute(f"import sys; sys.path.insert(0, {str(tmp_path)!r})")
    assert r.status == "ok", r.describe()
    probe(k, "warm_modules=warm_banner_mod")
    assert_warm(k, probe(k, "warm_modules=warm_banner_mod"))


def test_a_template_not_ready_in_time_is_ended_and_not_waited_for_again(kernelspec_installed,
                                                                        tmp_path):
    (tmp_path / "warm_slow_mod.py").write_text("import time\ntime.sleep(3600)\n")
    k = support.Kernel.start(env=support.kernel_env(DISTKERNEL_WARM_WAIT_S="1"))
    try:
        r = k.execute(f"import sys; sys.path.insert(0, {str(tmp_path)!r})")
        assert r.status == "ok", r.describe()
        why = warm_log_of(k, "warm_slow_mod")
        assert "not ready after 1.0 s" in why, why
        assert template_of(k) is None, "the template that was not ready runs on"
        why = warm_log_of(k, "warm_slow_mod")
        assert "failed before" in why and "not ready after 1.0 s" in why, why
        assert template_of(k) is None
        # Another fingerprint is tried afresh (whether torch imports within
        # the 1 s is up to the machine).
        assert "failed before" not in warm_log_of(k, "json")
    finally:
        k.stop()


def test_a_file_written_in_the_working_directory_keeps_the_template_an_edited_module_not(
        fresh_kernel, tmp_path):
    """A notebook's autosave writes into its folder (cwd, '' on sys.path): the
    folder's mtime must not rebuild the template. A warm module's file edited
    in place (its folder's mtime as before) must."""
    k = fresh_kernel
    work, mods = tmp_path / "work", tmp_path / "mods"
    work.mkdir()
    mods.mkdir()
    mod = mods / "warm_local_mod.py"
    mod.write_text("VALUE = 1\n")
    r = k.execute(f"import os, sys; os.chdir({str(work)!r}); sys.path.insert(0, {str(mods)!r})")
    assert r.status == "ok", r.describe()
    opts = "warm_modules=warm_local_mod"
    probe(k, opts)
    assert_warm(k, probe(k, opts))
    before = template_of(k)
    (work / ".~notebook.ipynb").write_text("{}")
    (work / ".~notebook.ipynb").unlink()
    (work / "out.txt").write_text("x")
    assert_warm(k, probe(k, opts))
    assert template_of(k) == before, "a file written in the working directory rebuilt it"
    folder = os.stat(mods)
    time.sleep(0.05)
    mod.write_text("VALUE = 2\n")
    os.utime(mods, ns=(folder.st_atime_ns, folder.st_mtime_ns))
    os.utime(mod, ns=(folder.st_atime_ns, folder.st_mtime_ns + 1_000_000_000))
    ranks = probe(k, opts)
    assert template_of(k) not in (None, before), "the edited warm module did not rebuild it"
    assert_warm(k, ranks)


def test_a_file_a_warm_cell_left_open_is_written_as_on_a_cold_rank(kernel, tmp_path):
    """A cold rank's interpreter teardown clears __main__, closing the file;
    a warm rank ends with os._exit and must do the same first."""
    r = kernel.execute(f"import os; _cwd = os.getcwd(); os.chdir({str(tmp_path)!r})")
    assert r.status == "ok", r.describe()
    results = []
    try:
        for opts in ("", "", "warm=False"):
            out = tmp_path / "out.txt"
            if out.exists():
                out.unlink()
            r = kernel.execute(f"%%distributed num_processes=1 tracking=False {opts}\n"
                               "import sys\nWARM = 'torch' in sys.modules\n"
                               "f = open('out.txt','w'); f.write('x')\nWARM", timeout=RUN)
            assert r.status == "ok", r.describe()
            assert out.read_text() == "x", (opts, r.result)
            results.append(r.result)
        # The second ran warm (the first may have built the template).
        assert "True" in results[1] and "False" in results[2], results
    finally:
        kernel.execute("os.chdir(_cwd)")


def test_a_run_from_another_thread_is_cold_and_leaves_the_template(kernel):
    """The template's PR_SET_PDEATHSIG follows the thread that started it, and
    a thread's run could replace the template under the main thread's: only
    the kernel's main thread uses it."""
    assert_warm(kernel, probe(kernel))
    template = template_of(kernel)
    r = kernel.execute("import threading\n"
                       "from distkernel import distributed\n"
                       "@distributed(num_processes=1, tracking=False)\n"
                       "def f():\n"
                       "    import os, sys\n"
                       "    return ('torch' in sys.modules, os.environ['DISTKERNEL_LOG'])\n"
                       "out = []\n"
                       "t = threading.Thread(target=lambda: out.append(f.distributed()))\n"
                       "t.start(); t.join()\n"
                       "print(repr(out))", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "(False, '" in r.stdout, r.describe()
    log = re.search(r"\(False, '([^']*)'\)", r.stdout).group(1)
    with open(os.path.join(os.path.dirname(log), "warm.log")) as f:
        why = f.read()
    assert "main thread" in why, why
    assert template_of(kernel) == template
    assert_warm(kernel, probe(kernel))


def test_a_peer_crash_after_warm_rank_0_returned_leaves_rank_0_finished(kernel):
    """Warm rank 0 holds the store for its peers after its RESULT; the job's
    stop after rank 1 crashed must not make it "ended by distkernel"."""
    assert_warm(kernel, probe(kernel))
    r = kernel.execute("%%distributed num_processes=2 tracking=False\n" + WARM_LINE +
                       "import os, signal, time, torch.distributed as dist\n"
                       "dist.init_process_group('gloo')\n"
                       "if dist.get_rank() == 1:\n"
                       "    time.sleep(2)\n"
                       "    os.kill(os.getpid(), signal.SIGKILL)\n"
                       "dist.get_rank()", timeout=RUN)
    assert r.status == "error", r.describe()
    assert_ran_warm(r)
    text = r.content["evalue"] + "\n".join(r.content.get("traceback", []))
    assert "rank 0: finished" in text, r.describe()


# Which warm modules a fresh run's node templates import (launcher=slurm;
# distkernel._dist.agent_warm_modules): all of them, unless the run's code,
# with everything it sends, imports only the standard library and names none.
# Judged in the kernel itself, on the payloads it would send; test_slurm_warm.py
# runs a light cell on the nodes.
CHOICE_SETUP = """
import collections, os
import numpy
def uses_os():
    return os.getpid()
def imports_torch():
    import torch
    return torch.__name__
class Plain:
    pass
plain, ordered, array = Plain(), collections.OrderedDict(), numpy.zeros(2)
"""
WARM = "torch,transformers"
CHOICES = {
    # light: nothing outside the standard library, no warm module named
    "print(os.getpid())": "",
    "uses_os()": "",
    "plain, ordered": "",
    "import json, re\nre.compile('x'), json.dumps(1)": "",
    # a notebook function that imports torch, a numpy array, an import of
    # anything else, a relative or dynamic import, a warm module named
    "imports_torch()": WARM,
    "array.sum()": WARM,
    "import torch": WARM,
    "import notebook_helpers": WARM,
    "from . import sibling": WARM,
    "__import__('sys')": WARM,
    "import importlib\nimportlib.import_module('sys')": WARM,
    "import sys\n'transformers' in sys.modules": WARM,
}


def test_a_fresh_runs_node_templates_import_only_what_its_code_may_use(kernel):
    r = kernel.execute(CHOICE_SETUP)
    assert r.status == "ok", r.describe()
    r = kernel.execute(
        "import json as _json\nfrom distkernel import _api as _a, _dist as _d\n"
        f"_json.dumps({{c: _d.agent_warm_modules(_d.prepare_cell(c), {WARM!r})\n"
        f"             for c in {list(CHOICES)!r}}})")
    assert r.status == "ok", r.describe()
    got = json.loads(ast.literal_eval(r.result))
    assert {c: v[0] for c, v in got.items()} == CHOICES, got
    # Said why when it is none; nothing to say otherwise.
    assert all((v[1] != "") == (v[0] == "") for v in got.values()), got
    assert "imports only the standard library" in got["uses_os()"][1], got
    # A .distributed() function's payload is judged the same way.
    r = kernel.execute(
        f"[_d.agent_warm_modules(_a._function_payload(f, (), {{}}), {WARM!r})[0]\n"
        " for f in (uses_os, imports_torch)]")
    assert r.status == "ok" and ast.literal_eval(r.result) == ["", WARM], r.describe()
    # No warm modules asked for: nothing to narrow.
    r = kernel.execute("_d.agent_warm_modules(_d.prepare_cell('import torch'), '')")
    assert r.status == "ok" and ast.literal_eval(r.result) == ("", ""), r.describe()
