"""Checkpoints of distributed training through distkernel.checkpoint (issue 36,
part 2), as a user of today's stack meets them: the kernel installed for the
test venv (scripts/venv.sh: torch 2 from PyPI) runs `%%distributed` cells whose
CPU ranks (gloo) save an FSDP2 model and its optimizer with
torch.distributed.checkpoint through `VolumeWriter`, and load them with
`VolumeReader` into another number of ranks.

Three cells, one kernel:
1. 4 ranks save steps 10, 20, 30 (keep=2); then step 40 fails twice, for want
   of room on one rank (a real EFBIG: RLIMIT_FSIZE in that rank) and in a root
   that is not writable (mode 0555; as root the ranks save as nobody, since
   root ignores modes);
2. 2 ranks load the newest complete checkpoint (30, not the partial folders
   that failed or "crashed" saves left), save step 50; a save into a root that
   a live process of another run holds is refused on every rank, one into a
   root whose record is of this run taken over; a record of another host is
   refused while fresh and taken over once stale; a missing root and one with
   no complete checkpoint are FileNotFoundErrors;
3. 4 ranks load the 2-rank checkpoint, and step 30 by name; a DDP model too.

Each comparison is of the whole model and optimizer, gathered, by the sha256
of their bytes: equal only where the load restored every value. Skipped where
the venv is not built, as test_today_torch.py is.
"""
import os
import shutil
import tempfile

import pytest

import support
from today import RUN, kernels, launch, needs_venv, tracking  # noqa: F401

pytestmark = needs_venv

# What the cells share, defined once in the kernel: the ranks get the names they use.
HELPERS = '''
ROOT, BUSY, MISSING, EMPTY, DDP_ROOT = {roots!r}
HOLDER = {holder!r}

def build(seed):
    """An MLP under FSDP2 (each layer, then the whole) and its AdamW."""
    import torch
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    for layer in model[::2]:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

def train(model, optim, step):
    import torch, torch.distributed as dist
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    model(torch.randn(8, 16, generator=g)).square().mean().backward()
    optim.step()
    optim.zero_grad()

def fingerprint(model, optim):
    """sha256 of the whole model and optimizer state, gathered (a collective)."""
    import hashlib, torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True))
    h = hashlib.sha256()
    flat = [(k, v) for k, v in msd.items()]
    flat += [(f"{{k}}/{{n}}", t) for k, s in osd["state"].items() for n, t in s.items()]
    for k, t in sorted(flat):
        h.update(k.encode() + t.detach().to(torch.float64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]

def save(model, optim, root, step, keep=2, **extra):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from distkernel.checkpoint import ExtraState, VolumeWriter
    msd, osd = get_state_dict(model, optim)
    writer = VolumeWriter(root, step=step, keep=keep)
    dcp.save({{"model": msd, "optim": osd, "extra": ExtraState(step=step, **extra)}},
             storage_writer=writer)
    return writer

def load(model, optim, root, step=None):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from distkernel.checkpoint import ExtraState, VolumeReader
    msd, osd = get_state_dict(model, optim)
    reader, extra = VolumeReader(root, step=step), ExtraState()
    state = {{"model": msd, "optim": osd, "extra": extra}}
    dcp.load(state, storage_reader=reader)
    set_state_dict(model, optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return reader.step, extra

def failure(fn):
    """What FN raised, as text (DCP's CheckpointException is a BaseException), or None."""
    try:
        fn()
    except BaseException as e:
        return f"{{type(e).__name__}}: {{e}}"
    return None

def without_room(fn, nbytes=1024):
    """FN with this process's files limited to NBYTES: its writes past them fail
    with EFBIG, as on a full volume (SIGXFSZ ignored, so the write returns the error)."""
    import resource, signal
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        return fn()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)

def unwritable(fn, root):
    """FN with ROOT mode 0555 on every rank; root ignores modes, so a root rank
    runs FN as nobody (its saved uid stays 0, to come back)."""
    import os, torch.distributed as dist
    if dist.get_rank() == 0:
        os.chmod(root, 0o555)
    dist.barrier()
    as_root = os.geteuid() == 0
    if as_root:
        os.seteuid(65534)
    try:
        return failure(fn)
    finally:
        if as_root:
            os.seteuid(0)
        dist.barrier()
        if dist.get_rank() == 0:
            os.chmod(root, 0o755)
'''

SAVE_4 = """%%distributed num_processes=4 result=first
import os, shutil, torch.distributed as dist
from distkernel.checkpoint import complete_steps, latest_step
dist.init_process_group("gloo")
rank = dist.get_rank()
model, optim = build(seed=1)
for step in (10, 20, 30):
    train(model, optim, step)
    writer = save(model, optim, ROOT, step, rank=rank)
out = {"kept": complete_steps(ROOT), "saved": [writer.step, str(writer.checkpoint_path)],
       "fp30": fingerprint(model, optim), "run": os.environ["TORCHELASTIC_RUN_ID"]}
train(model, optim, 40)
# one rank's volume is full: its write fails; every rank's save raises
out["no_room"] = failure(lambda: save(model, optim, ROOT, 40) if rank != 1
                         else without_room(lambda: save(model, optim, ROOT, 40)))
out["unwritable"] = unwritable(lambda: save(model, optim, ROOT, 40), ROOT)
dist.barrier()
if rank == 0:
    # a save that crashed after .metadata, before its rename
    shutil.copytree(os.path.join(ROOT, "step-00000030"),
                    os.path.join(ROOT, "step-00000099.partial-dead00"))
dist.barrier()
out["latest"] = latest_step(ROOT)
out["listing"] = sorted(os.listdir(ROOT))
dist.destroy_process_group()
out
"""

# another run's process: it takes BUSY by a save, then lives on
HOLDER = """
import sys, time, torch, torch.distributed.checkpoint as dcp
from distkernel.checkpoint import VolumeWriter
dcp.save({"x": torch.zeros(4)}, storage_writer=VolumeWriter(sys.argv[1], step=1), no_dist=True)
print("holding", flush=True)
time.sleep(300)
"""

LOAD_2 = """%%distributed num_processes=2 result=second
import json, os, subprocess, sys, time, torch, torch.distributed as dist
import distkernel.checkpoint as ck
rank = int(os.environ["RANK"])
if rank == 0:
    # another run (its own TORCHELASTIC_RUN_ID) that holds BUSY while it lives
    env = dict(os.environ, TORCHELASTIC_RUN_ID="other-run-7",
               PYTHONPATH=os.path.dirname(os.path.dirname(ck.__file__)))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, BUSY], env=env,
                              stdout=subprocess.PIPE, text=True)
dist.init_process_group("gloo")
out = {"missing": failure(lambda: ck.VolumeReader(MISSING)),
       "missing_latest": ck.latest_step(MISSING), "empty": failure(lambda: ck.VolumeReader(EMPTY)),
       "run": os.environ["TORCHELASTIC_RUN_ID"]}
model, optim = build(seed=2)
step, extra = load(model, optim, ROOT)
out.update(loaded=step, fp=fingerprint(model, optim), extra=extra.values,
           saved_world=extra.saved_world)
train(model, optim, 50)
save(model, optim, ROOT, 50, rank=rank)
out.update(fp50=fingerprint(model, optim), listing=sorted(os.listdir(ROOT)),
           holder=json.load(open(os.path.join(ROOT, ".writer.json"))))
if rank == 0:
    out["holder_ready"] = holder.stdout.readline().strip()
    out["holder_pid"] = holder.pid
dist.barrier()
out["busy"] = failure(lambda: save(model, optim, BUSY, 2))
dist.barrier()
if rank == 0:
    # a restart of this run finds the record of its own run id, holder alive: it takes over
    path = os.path.join(BUSY, ".writer.json")
    record = json.load(open(path))
    record["run_id"] = os.environ["TORCHELASTIC_RUN_ID"]
    json.dump(record, open(path, "w"))
dist.barrier()
out["restart"] = failure(lambda: save(model, optim, BUSY, 3))
out["busy_steps"] = ck.complete_steps(BUSY)
if rank == 0:
    holder.kill()
    holder.wait()
    # a run on another host: alive while its record is fresh, gone once stale
    far = {"run_id": "far-run", "host": "far-host", "pid": 1, "since": "then",
           "refreshed": time.time()}
    json.dump(far, open(path, "w"))
dist.barrier()
out["far"] = failure(lambda: save(model, optim, BUSY, 4))
dist.barrier()
if rank == 0:
    json.dump(dict(far, refreshed=time.time() - 600), open(path, "w"))
dist.barrier()
out["far_stale"] = failure(lambda: save(model, optim, BUSY, 5))
out["busy_steps_end"] = ck.complete_steps(BUSY)
dist.destroy_process_group()
out
"""

LOAD_4 = """%%distributed num_processes=4 result=third
import os, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP
from distkernel.checkpoint import VolumeReader, VolumeWriter
dist.init_process_group("gloo")
rank = dist.get_rank()
model, optim = build(seed=3)
step, extra = load(model, optim, ROOT)
out = {"loaded": step, "fp": fingerprint(model, optim), "extra": extra.values,
       "saved_world": extra.saved_world}
step, extra = load(model, optim, ROOT, step=30)
out.update(loaded_30=step, fp30=fingerprint(model, optim), extra_30=extra.values)
# DDP: every rank holds the whole model; DCP stores each value once
torch.manual_seed(4)
ddp = DDP(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
ddp(torch.randn(4, 8)).sum().backward()
opt.step()
msd, osd = get_state_dict(ddp, opt)
dcp.save({"model": msd, "optim": osd}, storage_writer=VolumeWriter(DDP_ROOT, step=1))
want = [p.detach().clone() for p in ddp.parameters()]
torch.manual_seed(5)
ddp2 = DDP(torch.nn.Linear(8, 8))
opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.1, momentum=0.9)
msd, osd = get_state_dict(ddp2, opt2)
state = {"model": msd, "optim": osd}
dcp.load(state, storage_reader=VolumeReader(DDP_ROOT))
set_state_dict(ddp2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
out["ddp_equal"] = all(torch.equal(a, b) for a, b in zip(want, ddp2.parameters()))
out["ddp_momentum"] = len(opt2.state_dict()["state"])
dist.destroy_process_group()
out
"""


@pytest.fixture(scope="module")
def volume():
    """The roots, in a folder every rank can reach as nobody too (pytest's own
    temporary folders are mode 0700)."""
    base = tempfile.mkdtemp(prefix="dk-checkpoints-")
    os.chmod(base, 0o755)
    os.mkdir(os.path.join(base, "empty"))
    os.mkdir(os.path.join(base, "empty", "step-00000005.partial-0a1b2c"))
    yield {name: os.path.join(base, name) for name in ("ckpt", "busy", "missing", "empty", "ddp")}
    for folder, _, _ in os.walk(base):
        os.chmod(folder, 0o755)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def kernel(kernels, tracking, volume, tmp_path_factory):
    """One kernel for the module's cells, with the helpers defined."""
    root = tmp_path_factory.mktemp("today-checkpoint")
    k = launch(kernels, root, tracking)
    roots = tuple(volume[n] for n in ("ckpt", "busy", "missing", "empty", "ddp"))
    r = k.execute(HELPERS.format(roots=roots, holder=HOLDER), timeout=RUN)
    assert r.status == "ok", r.describe()
    yield k
    k.stop()


def values_of(kernel, cell, name, world):
    r = kernel.execute(cell, timeout=RUN)
    assert r.status == "ok", r.describe()
    values = support.json_value(kernel, name)
    assert len(values) == world, values
    return values


def test_4_ranks_save_keep_the_newest_and_a_failed_save_raises_on_every_rank(kernel, volume):
    root = volume["ckpt"]
    first = values_of(kernel, SAVE_4, "first", 4)
    for rank, out in enumerate(first):
        # keep=2: step 10 was pruned once 30 was complete
        assert out["kept"] == [20, 30], out
        assert out["saved"] == [30, os.path.join(root, "step-00000030")], out
        # no room on rank 1: every rank's save raised, naming the folder and the reason
        no_room = out["no_room"] or ""
        assert no_room.startswith("CheckpointException"), (rank, no_room)
        assert f"rank 1 cannot write checkpoint step 40 into {root}/step-00000040.partial-" \
            in no_room, (rank, no_room)
        assert "File too large: the volume has no room for it" in no_room, (rank, no_room)
        # a root that is not writable: likewise
        unwritable = out["unwritable"] or ""
        assert f"cannot save checkpoint step 40 into the checkpoint root {root}: Permission " \
               "denied: the folder is not writable by this process" in unwritable, \
            (rank, unwritable)
        # the failed save left its partial folder; the newest complete one is still 30
        assert out["latest"] == 30, out
    assert first[0]["fp30"] == first[3]["fp30"]
    listing = first[0]["listing"]
    assert [n for n in listing if n.startswith("step-00000040.partial-")], listing
    assert {"step-00000020", "step-00000030", "step-00000099.partial-dead00"} <= set(listing)
    assert "step-00000010" not in listing and "step-00000040" not in listing, listing


def test_2_ranks_load_the_4_rank_checkpoint_and_a_busy_root_is_refused(kernel, volume):
    first = support.json_value(kernel, "first")
    second = values_of(kernel, LOAD_2, "second", 2)
    busy = volume["busy"]
    holder_pid = second[0]["holder_pid"]
    assert second[0]["holder_ready"] == "holding", second[0]
    for rank, out in enumerate(second):
        # the partial folders (a failed save's, a crashed one with .metadata) are not loaded
        assert out["loaded"] == 30, out
        assert out["fp"] == first[0]["fp30"], (out, first[0])
        # each rank got the extra values its rank saved; 4 ranks saved them
        assert out["extra"] == {"step": 30, "rank": rank} and out["saved_world"] == 4, out
        # step 50 complete: 20 pruned (keep=2), the partial folders cleaned away
        assert out["listing"] == [".writer.json", "step-00000030", "step-00000050"], out
        # this run took the root over from the first cell's run, whose ranks are gone
        assert out["holder"]["run_id"] == out["run"] != first[0]["run"], out
        # another run holds BUSY: every rank is refused, naming it
        busy_msg = out["busy"] or ""
        assert f"checkpoint root {busy} is held by another run: run 'other-run-7', pid " \
               f"{holder_pid} on host " in busy_msg, (rank, busy_msg)
        assert "wait for that run to end or stop it, or save into another root" in busy_msg
        # the record of this run's id (a restart's view): taken over, the save done
        assert out["restart"] is None, out
        assert out["busy_steps"] == [1, 3], out
        # a holder on another host: refused while seen within lock_stale_after (120 s)...
        assert f"checkpoint root {busy} is held by another run: run 'far-run', pid 1 on host " \
               "'far-host', since then, last seen " in (out["far"] or ""), out
        # ... taken over once not seen for longer
        assert out["far_stale"] is None and out["busy_steps_end"] == [3, 5], out
        # no root, or no complete checkpoint in it: FileNotFoundError naming it
        assert out["missing"].startswith(f"FileNotFoundError: [Errno 2] no checkpoint root "
                                         f"{volume['missing']}: it does not exist"), out
        assert out["missing_latest"] is None, out
        assert out["empty"].startswith(f"FileNotFoundError: [Errno 2] checkpoint root "
                                       f"{volume['empty']} holds no complete checkpoint; "
                                       "unfinished, never loaded: step-00000005.partial-"), out
    assert second[0]["fp50"] == second[1]["fp50"]
    assert not os.path.exists(volume["missing"])
    assert not support.alive(holder_pid)


def test_4_ranks_load_the_2_rank_checkpoint_and_a_step_by_name(kernel):
    first = support.json_value(kernel, "first")
    second = support.json_value(kernel, "second")
    third = values_of(kernel, LOAD_4, "third", 4)
    for rank, out in enumerate(third):
        assert out["loaded"] == 50 and out["fp"] == second[0]["fp50"], (out, second[0])
        # ranks beyond the 2 that saved get rank 0's values
        assert out["extra"] == {"step": 50, "rank": rank if rank < 2 else 0}, out
        assert out["saved_world"] == 2, out
        assert out["loaded_30"] == 30 and out["fp30"] == first[0]["fp30"], out
        assert out["extra_30"] == {"step": 30, "rank": rank}, out
        assert out["ddp_equal"] is True and out["ddp_momentum"] == 2, out
