"""VolumeDataset against a plain map-style Dataset over the same local files.

    VENV/bin/python bench/data_bench.py [--files 20000] [--size 4096] [--batch 64]
        [--workers 2] [--trials 9] [--no-remote] [--json out.json]

Both read every file as its bytes, through a DataLoader of the same
batch_size, num_workers and collate_fn, shuffled (the map-style one by the
DataLoader's RandomSampler, VolumeDataset by its seed and epoch). A sample is
a file; the rate is samples per second of one epoch, timed from iter() (the
workers' start included, as a training loop pays it) to the last batch.

Rows: the map-style reference; `VolumeDataset.loader()` (the documented way,
which counts batches for state_dict); a plain `DataLoader(VolumeDataset)`;
and, unless --no-remote, the same files as a `file://` URL through the node's
cache, cold (the cache emptied before the epoch) and warm. Each trial runs
every row once, in an order that rotates, after one untimed epoch each (the
page cache warm for all). The ratio is the median of each trial's
row / reference, measured side by side. Target: VolumeDataset.loader()
at least 0.95x. Also timed: the listing at construction.

Run it with the test venv's python (torch and fsspec); see bench/README.md.
"""

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from distkernel.data import VolumeDataset  # noqa: E402


class FilesDataset(Dataset):
    """The reference: the sorted files, read as bytes by index."""

    def __init__(self, root):
        self.paths = sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return f.read()


def as_list(batch):
    """The collate_fn of every row: the batch's bytes as a list."""
    return batch


def make_volume(root, files, size):
    """FILES files of SIZE random bytes, 100 to a folder."""
    for i in range(files):
        folder = os.path.join(root, f"part-{i // 100:05d}")
        if i % 100 == 0:
            os.makedirs(folder)
        with open(os.path.join(folder, f"{i:08d}.bin"), "wb") as f:
            f.write(os.urandom(size))


def rows(args, root, cache):
    """name -> fn() giving a fresh DataLoader for one epoch (and any preparation)."""
    common = dict(batch_size=args.batch, num_workers=args.workers, collate_fn=as_list)
    ref = FilesDataset(root)
    vol = VolumeDataset(root, seed=1)
    plain = VolumeDataset(root, seed=1)
    out = {"map-style Dataset": lambda: DataLoader(ref, shuffle=True, **common),
           "VolumeDataset.loader()": lambda: vol.loader(**common),
           "DataLoader(VolumeDataset)": lambda: DataLoader(plain, **common)}
    if args.remote:
        url = "file://" + root

        def cold():
            shutil.rmtree(cache, ignore_errors=True)
            return VolumeDataset(url, seed=1, cache_dir=cache).loader(**common)
        remote = {}

        def warm():
            if "ds" not in remote:
                remote["ds"] = VolumeDataset(url, seed=1, cache_dir=cache)
            return remote["ds"].loader(**common)
        out["file:// cache cold"] = cold
        out["file:// cache warm"] = warm
    return out


def cpu_seconds():
    """CPU time of this process and of its ended children (the DataLoader's
    workers, joined at the end of each epoch)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def epoch(make):
    """(samples per second, CPU microseconds per sample, samples) of one epoch
    of the loader MAKE() gives."""
    loader = make()
    t0, c0 = time.perf_counter(), cpu_seconds()
    n = sum(len(batch) for batch in loader)
    del loader
    return n / (time.perf_counter() - t0), (cpu_seconds() - c0) * 1e6 / n, n


def listing_time(root, repeat=3):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        VolumeDataset(root)
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--size", type=int, default=4096, help="bytes per file")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--no-remote", dest="remote", action="store_false",
                    help="leave out the file:// rows")
    ap.add_argument("--json")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="dk-data-bench-")
    try:
        root, cache = os.path.join(base, "volume"), os.path.join(base, "cache")
        make_volume(root, args.files, args.size)
        table = rows(args, root, cache)
        names = list(table)
        for name in names:                      # warm-up: page cache, imports
            epoch(table[name])
        rates = {name: [] for name in names}
        cpu = {name: [] for name in names}
        for t in range(args.trials):
            order = names[t % len(names):] + names[:t % len(names)]
            for name in order:
                rate, used, n = epoch(table[name])
                assert n == args.files, (name, n)
                rates[name].append(rate)
                cpu[name].append(used)
        listing = listing_time(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(args, names, rates, cpu, listing)


def report(args, names, rates, cpu, listing):
    ref = rates[names[0]]
    print(f"data_bench: {args.files} files of {args.size} bytes, batch {args.batch}, "
          f"{args.workers} workers, {args.trials} interleaved trials; torch {torch.__version__}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'':28} {'samples/s median':>17} {'min':>9} {'max':>9} {'ratio':>7} "
          f"{'CPU us/sample':>14} {'ratio':>7}")
    result = {"config": vars(args), "listing_s": listing, "rows": {}}
    for name in names:
        r = rates[name]
        ratio = statistics.median(a / b for a, b in zip(r, ref))
        # CPU per sample, as the reference's over this row's: above 1, cheaper
        cpu_ratio = statistics.median(b / a for a, b in zip(cpu[name], cpu[names[0]]))
        result["rows"][name] = {"samples_per_s": r, "median": statistics.median(r),
                                "ratio_to_map_style": ratio, "cpu_us_per_sample": cpu[name],
                                "cpu_ratio_to_map_style": cpu_ratio}
        print(f"{name:28} {statistics.median(r):17.0f} {min(r):9.0f} {max(r):9.0f} "
              f"{ratio:6.3f}x {statistics.median(cpu[name]):14.1f} {cpu_ratio:6.3f}x")
    got = result["rows"]["VolumeDataset.loader()"]["ratio_to_map_style"]
    print(f"VolumeDataset.loader() / map-style: {got:.3f}x (target >= 0.95x: "
          f"{'met' if got >= 0.95 else 'NOT met'})")
    print(f"listing {args.files} files at construction: {listing * 1000:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
