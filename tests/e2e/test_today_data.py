"""distkernel.data (issue 36, part 1) as a notebook user of today's stack meets
it: the kernel installed for the test venv (scripts/venv.sh: torch 2, fsspec)
runs one `%%distributed` cell of 4 CPU ranks (gloo) that read a volume of
1,000 small files with `UCVolumeDataset`, each through a DataLoader of 2
workers, and return what they read:

1. two epochs, the epoch advancing by itself: every file exactly once per
   epoch over the ranks, its bytes right, the same number of batches on every
   rank, and another order in the second epoch;
2. a resume: 5 batches, `state_dict()` saved with torch.save as a checkpoint
   holds it, a new dataset and loader that load it read exactly the rest of
   the epoch, and then the next epoch as an uninterrupted run reads it;
3. one sample per line with a buffer shuffle of 16: every line once, each
   moved by less than the buffer, and a resume in the middle;
4. the same files as an fsspec `file://` glob, through the node's cache (its
   default folder under XDG_CACHE_HOME) of 4,000 bytes, less than the data:
   copies are evicted and the reads are still exact; then every rank and
   worker reads the same files at once through that cache.

The errors (a missing path, an empty folder, a URL without fsspec) are raised
where the dataset is made, in the kernel itself. Skipped where the venv is not
built, as test_today_torch.py is.
"""
import collections
import os

import pytest

import support
from today import RUN, kernels, launch, needs_venv, tracking  # noqa: F401

pytestmark = needs_venv
FILES, RANKS, WORKERS, BATCH = 1000, 4, 2, 8
CACHE_SIZE = 4000          # bytes; the volume holds about 14,000


def file_name(i):
    return f"part-{i % 7}/sub{i % 3}/file{i:04d}.txt"


def lines_of(i):
    return [f"{i}:{j}" for j in range(i % 3 + 1)]


def listing():
    """The volume's files in the dataset's order: sorted by name."""
    return sorted(range(FILES), key=file_name)


CELL = r'''
import io, os, torch, torch.distributed as dist
from distkernel.data import UCVolumeDataset, VolumeDataset
dist.init_process_group("gloo")

def fid(name):
    return int(os.path.basename(name)[4:8])

def content(i):
    return "".join(f"{i}:{j}\n" for j in range(i % 3 + 1)).encode()

def files(loader, stop=None):
    """[file numbers, wrong contents, batches] of a pass, STOP batches at most."""
    ids, wrong, batches = [], 0, 0
    for names, datas in loader:
        ids += [fid(n) for n in names]
        wrong += sum(d != content(fid(n)) for n, d in zip(names, datas))
        batches += 1
        if batches == stop:
            break
    return [ids, wrong, batches]

def lines(loader, stop=None):
    got = []
    for k, batch in enumerate(loader):
        got += batch
        if k + 1 == stop:
            break
    return got

out = {"rank": dist.get_rank()}
# 1. two epochs; the epoch advances by itself
ds = UCVolumeDataset(ROOT, seed=7, with_path=True)
loader = ds.loader(batch_size=8, num_workers=2)
out["epochs"] = [files(loader), files(loader)]
out["epoch_after"], out["len"] = ds.epoch, len(loader)

# 2. 5 batches, the state saved as a checkpoint holds it, a new dataset resumes
first = VolumeDataset(ROOT, seed=7, with_path=True).loader(batch_size=8, num_workers=2)
head = files(first, stop=5)
saved = io.BytesIO()
torch.save({"step": 5, "data": first.state_dict()}, saved)
saved.seek(0)
state = torch.load(saved)["data"]
again = VolumeDataset(ROOT, seed=7, with_path=True)
again.load_state_dict(state)
resumed = again.loader(batch_size=8, num_workers=2)
out["resume"] = [head, files(resumed), files(resumed), state]

# 3. a sample per line, files in order, a buffer shuffle of 16; a resume after 3 batches
opts = dict(decode="lines", shuffle=False, shuffle_buffer=16, seed=3)
full = lines(VolumeDataset(ROOT, **opts).loader(batch_size=8, num_workers=2))
part = VolumeDataset(ROOT, **opts).loader(batch_size=8, num_workers=2)
head = lines(part, stop=3)
rest = VolumeDataset(ROOT, **opts)
rest.load_state_dict(part.state_dict())
out["lines"] = [full, head, lines(rest.loader(batch_size=8, num_workers=2))]

# 4. fsspec's file:// through the node's cache, smaller than the data; then
#    every rank and worker reading the same files through it at once
remote = VolumeDataset("file://" + ROOT + "/**/*.txt", seed=5, with_path=True,
                       cache_size=CACHE_SIZE)
out["remote"] = [files(remote.loader(batch_size=8, num_workers=2)), remote.cache_dir]
same = VolumeDataset("file://" + ROOT + "/**/file0[0-4]*.txt", rank=0, world_size=1,
                     with_path=True, cache_size=CACHE_SIZE)
out["same"] = files(same.loader(batch_size=8, num_workers=2))
dist.destroy_process_group()
out
'''


@pytest.fixture(scope="module")
def volume(tmp_path_factory):
    """1,000 files of 1 to 3 lines in nested folders, and files a listing
    leaves out (a dot name, Spark's _SUCCESS)."""
    root = tmp_path_factory.mktemp("volume")
    for i in range(FILES):
        path = root / file_name(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines_of(i)))
    (root / ".hidden.txt").write_text("not data\n")
    (root / "part-0" / "_SUCCESS").write_text("")
    return root


@pytest.fixture(scope="module")
def kernel(kernels, tracking, tmp_path_factory):
    """One kernel for the module's cells; XDG_CACHE_HOME is its own, where the
    ranks' default cache folder goes."""
    root = tmp_path_factory.mktemp("today-data")
    k = launch(kernels, root, tracking, XDG_CACHE_HOME=root / "xdg")
    k.xdg = root / "xdg"
    yield k
    k.stop()


@pytest.fixture(scope="module")
def ranks(kernel, volume):
    """What each of the 4 ranks read, in rank order."""
    cell = (f"%%distributed num_processes={RANKS} result=data_ranks\n"
            f"ROOT, CACHE_SIZE = {str(volume)!r}, {CACHE_SIZE}\n" + CELL)
    r = kernel.execute(cell, timeout=RUN)
    assert r.status == "ok", r.describe()
    # 1,000 files share evenly over 4 ranks: no warning of unequal shares
    assert "Traceback" not in r.stderr and "files over" not in r.stderr, r.stderr
    values = support.json_value(kernel, "data_ranks")
    assert [v["rank"] for v in values] == list(range(RANKS)), values
    return values


def exactly_once(lists, everything):
    """Each item of EVERYTHING once in the concatenated LISTS, and nothing else."""
    got = [x for one in lists for x in one]
    counts = collections.Counter(got)
    assert sorted(counts) == sorted(everything), (len(counts), len(everything))
    assert max(counts.values()) == 1, [x for x, n in counts.items() if n > 1][:10]


def test_two_epochs_read_every_file_once_in_a_new_order_with_equal_steps(ranks):
    per_file = FILES // RANKS // WORKERS                  # 125 files per worker
    batches = WORKERS * -(-per_file // BATCH)             # 16 each, the last of 5 files
    for epoch in (0, 1):
        exactly_once([v["epochs"][epoch][0] for v in ranks], range(FILES))
        for v in ranks:
            ids, wrong, steps = v["epochs"][epoch]
            assert wrong == 0 and steps == batches == v["len"], (epoch, v["rank"], wrong, steps)
    for v in ranks:
        assert v["epoch_after"] == 1
        first, second = v["epochs"][0][0], v["epochs"][1][0]
        # another order: not only the sequence, the rank's share of files too
        assert first != second and set(first) != set(second), v["rank"]


def test_a_resumed_epoch_reads_exactly_the_rest_then_the_next_epoch(ranks):
    rests = []
    for v in ranks:
        (head, wrong1, steps1), (rest, wrong2, _), (after, _, _), state = v["resume"]
        assert steps1 == 5 and wrong1 == wrong2 == 0, v["rank"]
        # 5 batches came from workers 0, 1, 0, 1, 0: 24 and 16 files
        assert (state["epoch"], state["consumed"], state["rank"]) == (0, [24, 16], v["rank"]), state
        # the rank's epoch, read before and after the checkpoint: no file twice, none missed
        exactly_once([head, rest], v["epochs"][0][0])
        rests.append(rest)
        # and the epoch after is the one an uninterrupted run reads, in its order
        assert after == v["epochs"][1][0], v["rank"]
    exactly_once([v["resume"][0][0] for v in ranks] + rests, range(FILES))


def worker_streams(rank):
    """The lines each worker of RANK reads, in order, before the buffer: with
    shuffle=False, rank r has every 4th file of the listing from r, and its
    worker w every 2nd of those from w."""
    mine = listing()[rank::RANKS]
    return [[line for i in mine[w::WORKERS] for line in lines_of(i)] for w in range(WORKERS)]


def test_the_buffer_shuffle_moves_lines_within_its_buffer_and_resumes(ranks):
    everything = [line for i in range(FILES) for line in lines_of(i)]
    exactly_once([v["lines"][0] for v in ranks], everything)
    moved = 0
    for v in ranks:
        full, head, rest = v["lines"]
        streams = worker_streams(v["rank"])
        for stream in streams:
            where = {line: k for k, line in enumerate(stream)}
            # the loader's order keeps each worker's order: its lines, as read
            out = [line for line in full if line in where]
            assert sorted(out) == sorted(stream)
            # a line leaves a buffer of 16 only after it came in: at most 15 early
            assert all(where[line] < k + 16 for k, line in enumerate(out)), v["rank"]
            moved += sum(where[line] != k for k, line in enumerate(out))
        # a resume in the middle: the rest, none again
        assert len(head) == 3 * BATCH
        exactly_once([head, rest], full)
    assert moved > len(everything) // 2, moved


def test_a_remote_volume_goes_through_a_bounded_cache_and_reads_exactly(ranks, kernel):
    exactly_once([v["remote"][0][0] for v in ranks], range(FILES))
    assert all(v["remote"][0][1] == 0 for v in ranks), [v["remote"][0][1] for v in ranks]
    folders = {v["remote"][1] for v in ranks}
    assert len(folders) == 1, folders          # one cache of the node for every rank
    folder = folders.pop()
    assert folder.startswith(str(kernel.xdg / "distkernel" / "volumes")), folder
    copies = [os.path.join(d, f) for d, _, names in os.walk(folder) for f in names
              if not f.startswith(".")]
    held = sum(os.path.getsize(p) for p in copies)
    # bounded: copies were evicted, and what stays is within the limit and counted right
    assert 0 < held <= CACHE_SIZE and len(copies) < FILES // 2, (held, len(copies))
    with open(os.path.join(folder, ".lock")) as f:
        assert int(f.read().split()[0]) == held
    # every rank and its workers read the same 500 files at once through the cache: whole
    for v in ranks:
        ids, wrong, _ = v["same"]
        assert sorted(ids) == list(range(500)) and wrong == 0, (v["rank"], wrong)


def kernel_error(kernel, code):
    r = kernel.execute(code, timeout=RUN)
    assert r.status == "error", r.describe()
    return r.content["ename"], r.content["evalue"]


def test_a_missing_path_is_an_error_where_the_dataset_is_made(kernel, volume):
    missing = str(volume / "no-such-folder")
    name, text = kernel_error(kernel, "from distkernel.data import UCVolumeDataset\n"
                                      "try:\n"
                                      f"    UCVolumeDataset({missing!r})\n"
                                      "except FileNotFoundError as e:\n"
                                      "    raise RuntimeError(type(e).__name__ + ': ' + str(e))\n")
    assert name == "RuntimeError" and text.startswith("VolumeNotFoundError: "), text
    assert f"{missing} does not exist" in text and "mounted on every node" in text, text


def test_an_empty_folder_is_an_error_where_the_dataset_is_made(kernel, volume):
    empty = volume.parent / "empty-volume"
    (empty / ".ipynb_checkpoints").mkdir(parents=True, exist_ok=True)
    (empty / "_SUCCESS").write_text("")
    name, text = kernel_error(kernel, "from distkernel.data import UCVolumeDataset\n"
                                      "try:\n"
                                      f"    UCVolumeDataset({str(empty)!r})\n"
                                      "except ValueError as e:\n"
                                      "    raise RuntimeError(type(e).__name__ + ': ' + str(e))\n")
    assert name == "RuntimeError" and text.startswith("EmptyVolumeError: "), text
    assert f"{empty} has no files to read" in text and "ignore=()" in text, text


def test_a_url_without_fsspec_says_what_to_install(kernel):
    name, text = kernel_error(kernel, "import sys\n"
                                      "from distkernel.data import UCVolumeDataset\n"
                                      "saved = sys.modules.pop('fsspec', None), "
                                      "sys.modules.pop('fsspec.core', None)\n"
                                      "sys.modules['fsspec'] = None\n"
                                      "try:\n"
                                      "    UCVolumeDataset('s3://bucket/images/**/*.jpg')\n"
                                      "finally:\n"
                                      "    sys.modules.pop('fsspec')\n"
                                      "    for mod, key in zip(saved, ('fsspec', 'fsspec.core')):\n"
                                      "        if mod is not None: sys.modules[key] = mod\n")
    assert name == "ImportError", (name, text)
    assert "s3://bucket/images/**/*.jpg" in text and "pip install fsspec s3fs" in text, text


def test_a_dataset_made_in_the_notebook_is_checked_before_the_ranks_and_shared_by_them(
        kernel, volume):
    # A missing path raises in the notebook, before any rank starts; a good
    # one, made there, goes to the ranks with the cell, and each reads its
    # share (its rank is found when it iterates, not when the dataset was made).
    missing = str(volume / "not-here")
    r = kernel.execute("from distkernel.data import VolumeDataset\n"
                       f"ds = VolumeDataset({missing!r})\n", timeout=60)
    assert r.status == "error" and r.content["ename"] == "VolumeNotFoundError", r.describe()
    assert support.status_displays(r) == []
    r = kernel.execute(f"ds = VolumeDataset({str(volume)!r}, with_path=True)\nds.files",
                       timeout=60)
    assert r.status == "ok" and r.result == str(FILES), r.describe()
    r = kernel.execute("%%distributed num_processes=2 result=shares\n"
                       "sorted(name for name, _ in ds)\n", timeout=RUN)
    assert r.status == "ok", r.describe()
    shares = support.json_value(kernel, "shares")
    assert [len(s) for s in shares] == [FILES // 2, FILES // 2], [len(s) for s in shares]
    exactly_once(shares, [str(volume / file_name(i)) for i in range(FILES)])
