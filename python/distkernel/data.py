"""The files of a volume as a torch IterableDataset: `VolumeDataset`, which the
managed platform's notebooks know as `UCVolumeDataset` (serverless_gpu.data,
databricks.air.data). docs/data.md is the user's page.

It owns: listing a volume once (a local or shared folder, a glob, an fsspec
URL), sorted alike on every rank; an epoch's order (files shuffled from seed
and epoch, split by rank, then by DataLoader worker; an optional seeded
buffer shuffle); files turned into samples; the node's bounded, shared cache
of remote files; and the position in an epoch that state_dict() saves and
load_state_dict() resumes, counted where the DataLoader is iterated.
"""

import contextlib
import fcntl
import hashlib
import itertools
import os
import random
import re
import shutil
import tempfile
import time
import warnings
import zlib
from array import array
from collections import namedtuple

try:
    import torch
    import torch.distributed
    from torch.utils.data import (DataLoader, IterableDataset, default_collate, default_convert,
                                  get_worker_info)
except ImportError as _e:
    raise ImportError("distkernel.data needs torch in this Python environment: "
                      "pip install torch") from _e

__all__ = ["VolumeDataset", "UCVolumeDataset", "VolumeLoader", "VolumeNotFoundError",
           "EmptyVolumeError"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_MAGIC = re.compile(r"[*?[]")
# The package that gives fsspec a protocol, for the error that says what to install.
_PROTOCOL_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs",
                      "abfs": "adlfs", "abfss": "adlfs", "az": "adlfs", "hf": "huggingface_hub",
                      "http": "aiohttp", "https": "aiohttp", "sftp": "paramiko",
                      "ssh": "paramiko", "hdfs": "pyarrow", "webhdfs": "requests"}
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
_DECODES = ("bytes", "text", "lines")
_STATE_VERSION = 1
_PART = ".part-"          # a download in progress in the cache
_STALE_PART = 3600.0      # seconds after which a download's leftover is removed


class VolumeNotFoundError(FileNotFoundError):
    """The volume's path, or the folder a glob starts from, does not exist."""


class EmptyVolumeError(ValueError):
    """The volume's folder or glob holds no file to read."""


# An iteration's plan: the epoch, the rank of how many, the DataLoader workers
# sharing the rank's files (0: the process reads them) and each one's skip.
_Plan = namedtuple("_Plan", "epoch rank world workers skips")


def parse_size(value):
    """Bytes of VALUE: an int, or a string such as "10GB", "500 MB", "2GiB"."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([A-Za-z]*)\s*", str(value))
    if isinstance(value, bool) or not m or m[2].lower() not in _UNITS or not float(m[1]):
        raise ValueError(f"cache_size={value!r}: give bytes or a size such as '10GB', "
                         "'500MB' or '2GiB'")
    return max(1, int(float(m[1]) * _UNITS[m[2].lower()]))


def _mix(*parts):
    """A 63-bit seed from PARTS ((seed, epoch) pairs do not collide as sums do)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _env_rank_world():
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world is None:
        return None
    if rank is None or world is None:
        have, lack = ("WORLD_SIZE", "RANK") if rank is None else ("RANK", "WORLD_SIZE")
        raise ValueError(f"{have} is set in the environment but {lack} is not, so this "
                         "process cannot tell which files are its own: set both (torchrun "
                         "and %%distributed do), neither (one process reads every file), or "
                         "pass rank= and world_size=")
    return int(rank), int(world)


# -- listing ----------------------------------------------------------------------------

def _component_regex(comp):
    """The regex of one glob path component: * ? [...] [!...], never crossing '/'."""
    out, i = [], 0
    while i < len(comp):
        c = comp[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            k = i + 1 if comp[i:i + 1] == "!" else i
            k += comp[k:k + 1] == "]"        # a ']' first in a class is literal
            j = comp.find("]", k)
            if j < 0:
                out.append(re.escape(c))
                continue
            body, i = comp[i:j], j + 1
            neg = body.startswith("!")
            body = (body[1:] if neg else body).replace("\\", "\\\\")
            if not neg and body.startswith("^"):
                body = "\\" + body
            out.append(("[^" if neg else "[") + body + "]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def _glob_regex(pattern):
    """(compiled regex, max depth or None) of a glob relative to its root;
    `**` as a whole component matches any number of folders."""
    comps = pattern.split("/")
    parts = []
    for i, comp in enumerate(comps):
        last = i == len(comps) - 1
        if comp == "**":
            parts.append(".*" if last else "(?:[^/]+/)*")
        else:
            parts.append(_component_regex(comp) + ("" if last else "/"))
    depth = None if "**" in comps else len(comps)
    return re.compile("".join(parts)), depth


def _split_glob(path):
    """(root, pattern or None): the folders before the first component with a
    wildcard, and the rest."""
    comps = path.split("/")
    for i, comp in enumerate(comps):
        if _MAGIC.search(comp):
            root = "/".join(comps[:i])
            if not root:
                root = "/" if path.startswith("/") else "."
            return root, "/".join(comps[i:])
    return path, None


def _walk_local(root, maxdepth, ignore):
    """Names of the files under ROOT, relative to it, skipping names that start
    with an IGNORE prefix. Folders are read with scandir, whose entry types
    cost no stat; symlinked folders are not followed (no cycles)."""
    out = []
    stack = [(root, "", 1)]
    while stack:
        folder, rel, depth = stack.pop()
        with os.scandir(folder) as entries:
            for e in entries:
                if e.name.startswith(ignore):
                    continue
                if e.is_dir(follow_symlinks=False):
                    if maxdepth is None or depth < maxdepth:
                        stack.append((e.path, rel + e.name + "/", depth + 1))
                elif e.is_file():
                    out.append(rel + e.name)
    return out


def _not_found(path, what="does not exist"):
    return VolumeNotFoundError(f"volume path {path} {what}: check the path (a folder, a file, "
                               "a glob such as folder/**/*.jpg, or a URL such as s3://...), "
                               "and that the volume is mounted on every node")


def _empty(path, ignore):
    skipped = (f" (names starting with {' or '.join(repr(p) for p in ignore)} are left "
               "out; pass ignore=() to read them)") if ignore else ""
    return EmptyVolumeError(f"volume path {path} has no files to read{skipped}: check the "
                            "path and the glob, or write the data first")


def _list_local(path, ignore):
    """(root folder, sorted names relative to it) of a local path or glob."""
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    root, pattern = _split_glob(path)
    if pattern is None:
        if os.path.isfile(path):
            return os.path.dirname(path), [os.path.basename(path)]
        if not os.path.isdir(path):
            raise _not_found(path)
        names = _walk_local(path, None, ignore)
    else:
        if not os.path.isdir(root):
            raise _not_found(path, f"does not exist: its folder {root} is not there")
        regex, depth = _glob_regex(pattern)
        names = [n for n in _walk_local(root, depth, ignore) if regex.fullmatch(n)]
    if not names:
        raise _empty(path, ignore)
    names.sort()
    return root, names


def _remote_fs(url, storage_options, shown=None):
    """(fsspec filesystem, path in it) of URL; errors name SHOWN (the user's URL)."""
    shown, protocol = shown or url, url.split("://", 1)[0]
    extra = _PROTOCOL_PACKAGES.get(protocol.lower())
    try:
        import fsspec.core
    except ImportError:
        raise ImportError(f"reading {shown} needs fsspec{f' and {extra}' if extra else ''}: "
                          f"pip install fsspec{f' {extra}' if extra else ''}") from None
    try:
        return fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as e:
        raise ImportError(f"reading {shown} needs fsspec's {protocol} protocol: pip install "
                          f"{extra or 'the package that provides it'} ({e})") from e
    except ValueError as e:
        raise ValueError(f"reading {shown}: fsspec does not know this protocol ({e})") from e


def _list_remote(url, storage_options, ignore):
    """(root URL, root path in its filesystem, sorted names relative to it)."""
    root_url, pattern = _split_glob(url)
    fs, root = _remote_fs(root_url, storage_options, url)
    root = root.rstrip("/") or root
    if pattern is None and fs.isfile(root):
        parent_url, name = root_url.rstrip("/").rsplit("/", 1)
        return parent_url, root.rsplit("/", 1)[0], [name]
    if not fs.isdir(root):
        raise _not_found(url, "does not exist" if pattern is None
                         else f"does not exist: its folder {root_url} is not there")
    regex, depth = _glob_regex(pattern) if pattern is not None else (None, None)
    names = []
    for p in fs.find(root, maxdepth=depth, withdirs=False):
        rel = p[len(root):].lstrip("/")
        if any(c.startswith(ignore) for c in rel.split("/")):
            continue
        if regex is None or regex.fullmatch(rel):
            names.append(rel)
    if not names:
        raise _empty(url, ignore)
    names.sort()
    return root_url.rstrip("/"), root, names


class _Names:
    """A sorted list of names packed into one bytes object and an offset array:
    a million paths cost two buffers, not a million objects, so a forked
    worker does not copy them by touching their reference counts, and a
    spawned one unpickles them at once."""

    __slots__ = ("_blob", "_ends", "_crc")

    def __init__(self, names):
        enc = [n.encode("utf-8", "surrogateescape") for n in names]
        self._blob = b"".join(enc)
        self._ends = array("q", itertools.accumulate(len(b) for b in enc))
        self._crc = None

    def __len__(self):
        return len(self._ends)

    def __getitem__(self, i):
        start = self._ends[i - 1] if i else 0
        return self._blob[start:self._ends[i]].decode("utf-8", "surrogateescape")

    def fingerprint(self):
        """A checksum of the listing, which a saved position is only valid for."""
        if self._crc is None:
            self._crc = zlib.crc32(self._ends.tobytes(), zlib.crc32(self._blob))
        return self._crc


# -- the node's cache of remote files -----------------------------------------------------

class _Cache:
    """Copies of remote files in a folder of the node, at most LIMIT bytes of
    them, the least recently used removed first, used by all of the node's
    ranks and workers at once. A copy is written under a temporary name and
    renamed into place: no reader opens a partial file, and two processes
    that fetch the same file both end with a whole one. The running total and
    eviction are under an flock of FOLDER/.lock (opened each time: a
    descriptor inherited over fork would share its lock). A hit touches the
    copy's mtime; eviction scans the folder and removes down to 90% of the
    limit, so that one scan serves many fetches."""

    def __init__(self, folder, limit):
        self.folder, self.limit = folder, limit

    def path_of(self, name):
        h = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self.folder, h[:2], h[2:])

    def open(self, name, fetch):
        """A binary file object of NAME's copy, fetched with FETCH(file) if not
        here. An open copy stays readable even if it is evicted meanwhile."""
        path = self.path_of(name)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return self._download(path, fetch)
        with contextlib.suppress(OSError):
            os.utime(f.fileno())
        return f

    def _download(self, path, fetch):
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_PART, dir=folder)
        f = os.fdopen(fd, "w+b")
        try:
            fetch(f)
            f.flush()
            size = f.tell()
            f.seek(0)
            with self._locked() as state:
                if size > self.limit or os.path.exists(path):
                    # too big to keep, or another process's copy won: read ours, keep theirs
                    os.unlink(tmp)
                else:
                    os.replace(tmp, path)
                    state[0] += size
                    if state[0] > self.limit:
                        state[0] = self._scan(keep=path, target=self.limit * 9 // 10)
        except BaseException:
            f.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return f

    @contextlib.contextmanager
    def _locked(self):
        """[total bytes] under the lock; what the caller leaves in it is stored."""
        fd = os.open(os.path.join(self.folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                state = [int(os.pread(fd, 32, 0).split()[0])]
            except (ValueError, IndexError):
                state = [self._scan(keep=None, target=None)]
            yield state
            os.pwrite(fd, b"%20d\n" % state[0], 0)
        finally:
            os.close(fd)

    def _scan(self, keep, target):
        """Bytes of the copies after removing the least recently used ones down
        to TARGET (None: none), never KEEP; leftovers of killed downloads go too."""
        now, total, copies = time.time(), 0, []
        for sub in os.scandir(self.folder):
            if len(sub.name) != 2 or not sub.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(sub.path):
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if e.name.startswith(_PART):
                    if now - st.st_mtime > _STALE_PART:
                        with contextlib.suppress(OSError):
                            os.unlink(e.path)
                    continue
                total += st.st_size
                if e.path != keep:
                    copies.append((st.st_mtime, st.st_size, e.path))
        if target is not None and total > target:
            copies.sort()
            for _, size, p in copies:
                if total <= target:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
                    total -= size
        return total


def default_cache_dir(url):
    """The node's cache folder of the volume at URL."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(base, "distkernel", "volumes", key)


# -- reading samples ----------------------------------------------------------------------

def _buffer_shuffle(items, size, rng):
    """ITEMS in a random order that moves none of them more than SIZE - 1
    places earlier: each output is drawn from a buffer of the next SIZE."""
    buf = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        yield buf[j]
        buf[j] = item
    rng.shuffle(buf)
    yield from buf


def _strip_newline(raw):
    if raw.endswith(b"\n"):
        raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
    return raw.decode("utf-8")


def _with_note(err, name):
    if hasattr(err, "add_note"):     # 3.11's; on 3.10 the error goes as it is
        err.add_note(f"while reading {name} of a VolumeDataset")


class VolumeDataset(IterableDataset):
    """The files under PATH (a folder, a file, a glob with `**`, or an fsspec
    URL) as an IterableDataset, each rank and DataLoader worker reading its
    own share. decode: "bytes" (default), "text", "lines" or fn(name, data)
    (flatten=True: fn returns the file's samples). docs/data.md has every
    option."""

    def __init__(self, path, *, decode="bytes", flatten=False, with_path=False, shuffle=True,
                 seed=0, shuffle_buffer=0, drop_last=None, cache_dir=None, cache_size="10GB",
                 storage_options=None, ignore=(".", "_"), rank=None, world_size=None):
        super().__init__()
        if not (callable(decode) or decode in _DECODES):
            raise ValueError(f"decode={decode!r}: give one of {', '.join(_DECODES)} or a "
                             "function fn(name, data) -> sample")
        if flatten and not callable(decode):
            raise ValueError("flatten=True is for a decode function that returns the "
                             "samples of a file; decode='lines' already gives one per line")
        if int(shuffle_buffer) < 0:
            raise ValueError(f"shuffle_buffer={shuffle_buffer!r}: give a number of samples >= 0")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank= and world_size=, or neither")
        if world_size is not None and not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank={rank} is not one of world_size={world_size}'s ranks")
        self.path, self.decode, self.flatten, self.with_path = path, decode, flatten, with_path
        self.shuffle, self.seed, self.shuffle_buffer = bool(shuffle), seed, int(shuffle_buffer)
        self.drop_last = bool(drop_last)
        self.storage_options = dict(storage_options or {})
        ignore = tuple(ignore)
        self._explicit = None if rank is None else (int(rank), int(world_size))
        self._captured = (0, 1)
        self._captured = self._rank_world()
        self._list(ignore, cache_dir, cache_size)
        self._check_split(drop_last)
        # progress, in the process that iterates (see _begin)
        self._epoch, self._epoch_set, self._begun = 0, False, False
        self._resume, self._workers, self._consumed = None, 0, []
        self._loader_plan = None

    def _list(self, ignore, cache_dir, cache_size):
        spec = os.fspath(self.path)
        self.remote = bool(_URL.match(spec))
        self._fs = None
        if not self.remote:
            self._root, names = _list_local(spec, ignore)
            self._cache = None
        else:
            self._root, self._fs_root, names = _list_remote(spec, self.storage_options, ignore)
            folder = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir(self._root)))
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as e:
                raise OSError(f"the cache folder {folder} of {spec} cannot be made ({e}): "
                              "pass cache_dir= a writable folder on the node's disk") from e
            self._cache = _Cache(folder, parse_size(cache_size))
        self._names = _Names(names)

    def _check_split(self, drop_last):
        n, (rank, world) = len(self._names), self._captured
        if self.drop_last and n < world:
            raise ValueError(f"{self.path} has {n} files for {world} ranks: with drop_last=True "
                             "every rank would get none; use drop_last=False or more files")
        if drop_last is None and n % world and rank == 0:
            warnings.warn(f"{self.path}: {n} files over {world} ranks, so {n % world} ranks "
                          "read one file more per epoch. A DDP loop needs the same number of "
                          "steps on every rank: pass drop_last=True (the ranks skip the "
                          f"{n % world} last files of each epoch's order), or drop_last=False "
                          "to read every file and silence this", stacklevel=3)

    cache_dir = property(lambda self: self._cache.folder if self._cache else None,
                         doc="The node's cache folder of a remote volume (None: local).")
    epoch = property(lambda self: self._epoch, doc="The epoch being read, or last read.")
    files = property(lambda self: len(self._names), doc="Number of files in the listing.")

    def name(self, i):
        """The name (path or URL) of file I of the sorted listing."""
        rel = self._names[i]
        return os.path.join(self._root, rel) if not self.remote else f"{self._root}/{rel}"

    @property
    def _per_file(self):
        # one sample per file: a position is a count of files, and skipping or
        # buffering needs no reading
        return self.decode != "lines" and not self.flatten

    def _rank_world(self):
        if self._explicit is not None:
            return self._explicit
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        env = _env_rank_world()
        return env if env is not None else self._captured

    # -- the epoch's order ------------------------------------------------------------

    def set_epoch(self, epoch):
        """Read EPOCH next (as DistributedSampler.set_epoch). Without it each new
        iteration reads the epoch after the last. A position loaded with
        load_state_dict is kept if EPOCH is its epoch."""
        epoch = int(epoch)
        if self._resume is not None and epoch != self._epoch:
            self._resume = None
        if self._resume is None:
            self._consumed = []       # the epoch is read from its start
        self._epoch, self._epoch_set = epoch, True

    def _begin(self, workers):
        """The plan of a new iteration by WORKERS DataLoader workers (0: this
        process), and the progress reset to it: the epoch set, else a loaded
        position's, else the one after the last iteration's."""
        epoch = self._epoch
        if self._begun and not self._epoch_set and self._resume is None:
            epoch += 1
        rank, world = self._rank_world()
        skips = [0] * max(1, workers)
        if self._resume is not None:
            skips = self._resume_skips(self._resume, rank, world, workers) or skips
        self._epoch, self._epoch_set, self._begun, self._resume = epoch, False, True, None
        self._workers, self._consumed, self._captured = workers, list(skips), (rank, world)
        return _Plan(epoch, rank, world, workers, tuple(skips))

    def _shard(self, plan, worker):
        """Indices of the files WORKER of PLAN's rank reads, in order. The
        epoch's order is one permutation of the listing that every process
        computes alike; rank r takes every world-th file from r, and its
        worker w every workers-th of those from w."""
        n = len(self._names)
        keep = n - n % plan.world if self.drop_last else n
        step = plan.world * max(1, plan.workers)
        start = plan.rank + plan.world * worker
        if not self.shuffle:
            return range(start, keep, step)
        g = torch.Generator()
        g.manual_seed(_mix(self.seed, plan.epoch))
        return torch.randperm(n, generator=g)[start:keep:step].tolist()

    def __iter__(self):
        info = get_worker_info()
        plan = self._loader_plan
        if plan is None:
            plan = self._begin(info.num_workers if info else 0)
        worker = info.id if info else 0
        samples = self._samples(plan, worker)
        if info is None and self._loader_plan is None:
            return self._counting(samples, self._consumed)
        return samples

    @staticmethod
    def _counting(samples, consumed):
        for s in samples:
            consumed[0] += 1     # before the yield: a sample handed out is consumed
            yield s

    def _samples(self, plan, worker):
        files = self._shard(plan, worker)
        skip, size = plan.skips[worker], self.shuffle_buffer
        rng = random.Random(_mix(self.seed, plan.epoch, plan.rank, worker, "buffer"))
        if self._per_file:
            if size:
                files = list(_buffer_shuffle(files, size, rng))
            return map(self._reader(), itertools.islice(files, skip, None))
        samples = self._expand(files)
        if size:
            samples = _buffer_shuffle(samples, size, rng)
        return itertools.islice(samples, skip, None)

    # -- reading files ---------------------------------------------------------------

    def _open(self, i):
        """(name, binary file object) of file I; a remote one through the cache."""
        name = self.name(i)
        if not self.remote:
            return name, open(name, "rb")
        fs = self._filesystem()
        remote = f"{self._fs_root.rstrip('/')}/{self._names[i]}"

        def fetch(dst):
            with fs.open(remote, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
        return name, self._cache.open(name, fetch)

    def _filesystem(self):
        # one per process: a filesystem object made before a fork may hold the
        # parent's connections and event loop
        if self._fs is None or self._fs[0] != os.getpid():
            self._fs = (os.getpid(), _remote_fs(self._root, self.storage_options)[0])
        return self._fs[1]

    def _reader(self):
        """fn(file index) -> sample, for one-sample-per-file decodes. A local
        file's path is made inline: per sample, calls cost as much as a read."""
        decode, with_path, remote = self.decode, self.with_path, self.remote
        blob, ends, prefix = self._names._blob, self._names._ends, os.path.join(self._root, "")

        def read(i):
            if remote:
                name, f = self._open(i)
            else:
                name = prefix + blob[ends[i - 1] if i else 0:ends[i]].decode("utf-8",
                                                                            "surrogateescape")
                f = open(name, "rb")
            with f:
                sample = f.read()
            if decode != "bytes":
                try:
                    sample = sample.decode("utf-8") if decode == "text" else decode(name, sample)
                except Exception as e:
                    _with_note(e, name)
                    raise
            return (name, sample) if with_path else sample
        return read

    def _expand(self, files):
        """The samples of FILES in order, for decodes that give several per file."""
        decode, with_path = self.decode, self.with_path
        for i in files:
            name, f = self._open(i)
            with f:
                try:
                    if decode == "lines":
                        samples = map(_strip_newline, f)
                    else:
                        samples = decode(name, f.read())
                    for s in samples:
                        yield (name, s) if with_path else s
                except Exception as e:
                    _with_note(e, name)
                    raise

    def __len__(self):
        """Samples this rank reads per epoch, where a file is one sample."""
        if not self._per_file:
            raise TypeError(f"decode={self.decode!r} gives a number of samples per file that "
                            "is known only after reading them, so the dataset has no length")
        rank, world = self._rank_world()
        n = len(self._names)
        return len(range(rank, n - n % world if self.drop_last else n, world))

    def __getstate__(self):
        return dict(self.__dict__, _fs=None)

    # -- the position ----------------------------------------------------------------

    def _decode_label(self):
        if callable(self.decode):
            return "function, flattened" if self.flatten else "function"
        return self.decode

    def state_dict(self):
        """This rank's position: the epoch and the samples of it consumed, per
        DataLoader worker; exact when the dataset is iterated itself, by a
        DataLoader with num_workers=0, or by loader() with any num_workers."""
        rank, world = self._captured if self._begun else self._rank_world()
        if self._resume is not None:
            return dict(self._resume if isinstance(self._resume, dict) else self._resume[rank])
        n = len(self._names)
        return {"version": _STATE_VERSION, "epoch": self._epoch, "rank": rank,
                "world_size": world, "num_workers": self._workers,
                "consumed": list(self._consumed), "samples": sum(self._consumed),
                "files": n, "listing": self._names.fingerprint(), "seed": self.seed,
                "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer,
                "drop_last": self.drop_last, "decode": self._decode_label(),
                # the same on every rank at the same step: one sample per file, equal shares
                "same_on_every_rank": self._per_file and (self.drop_last or n % world == 0)}

    def load_state_dict(self, state):
        """Continue from STATE, one rank's state_dict() or the list of every
        rank's (as all_gather_object gives), at the next iteration: the rest
        of its epoch, no sample again and none left out."""
        states = [state] if isinstance(state, dict) else list(state)
        if not states or not all(isinstance(s, dict) for s in states):
            raise ValueError("load_state_dict takes a state_dict() or a list of every rank's")
        want = {"files": len(self._names), "listing": self._names.fingerprint(),
                "seed": self.seed, "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer,
                "drop_last": self.drop_last, "decode": self._decode_label()}
        for s in states:
            if s.get("version") != _STATE_VERSION:
                raise ValueError(f"not a VolumeDataset state (version {s.get('version')!r})")
            differ = [f"{k}={s.get(k)!r} (now {v!r})" for k, v in want.items() if s.get(k) != v]
            if differ:
                raise ValueError("this state was saved with another listing or order of "
                                 f"{self.path}: {', '.join(differ)}; a position is only valid "
                                 "for the same files and options")
        self._resume = state if isinstance(state, dict) else states
        self._epoch, self._epoch_set = states[0]["epoch"], False

    def _resume_skips(self, resume, rank, world, workers):
        """The per-worker skips of RESUME for this rank, checked against the run."""
        if isinstance(resume, dict):
            s = resume
        elif len(resume) != world:
            raise ValueError(f"the states are of {len(resume)} ranks, this run has {world}")
        else:
            s = resume[rank]
        if s["world_size"] != world:
            raise ValueError(f"the state was saved by {s['world_size']} ranks, this run has "
                             f"{world}: resume with the same number of ranks")
        if not sum(s["consumed"]):
            return None
        if s["rank"] != rank and not s["same_on_every_rank"]:
            raise ValueError(f"this state is rank {s['rank']}'s; rank {rank} cannot resume "
                             "from it (its share differs): save every rank's state_dict() "
                             "(e.g. gathered with all_gather_object) and load the list")
        if max(1, s["num_workers"]) != max(1, workers):
            raise ValueError(f"the state was saved reading with num_workers={s['num_workers']}, "
                             f"this iteration has {workers}: resume with the same")
        return list(s["consumed"])

    def loader(self, batch_size=1, **kwargs):
        """A DataLoader (KWARGS are its own) that advances the epoch and counts
        what it hands out, so that state_dict() is exact with any num_workers."""
        return VolumeLoader(self, batch_size=batch_size, **kwargs)


UCVolumeDataset = VolumeDataset


class _Tagged:
    """A collate_fn that returns (worker, samples, batch): run in the worker, it
    tells the main process which worker's position each batch advances."""

    def __init__(self, collate, batched):
        self.collate, self.batched = collate, batched

    def __call__(self, data):
        info = get_worker_info()
        return (info.id if info else 0, len(data) if self.batched else 1, self.collate(data))


class VolumeLoader(DataLoader):
    """VolumeDataset.loader's DataLoader: each batch it hands out is counted
    against the worker that made it, so that a state_dict() taken between
    batches resumes at the next one."""

    def __init__(self, dataset, batch_size=1, *, collate_fn=None, **kwargs):
        if not isinstance(dataset, VolumeDataset):
            raise TypeError("VolumeLoader reads a VolumeDataset")
        if kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers=True: workers kept between epochs would not "
                             "learn the next epoch's order; VolumeLoader starts them each epoch")
        for name in ("shuffle", "sampler", "batch_sampler"):
            if kwargs.get(name):
                raise ValueError(f"{name}=: the order is the dataset's (shuffle=, seed=, "
                                 "shuffle_buffer= of VolumeDataset)")
        if collate_fn is None:
            collate_fn = default_collate if batch_size is not None else default_convert
        super().__init__(dataset, batch_size=batch_size,
                         collate_fn=_Tagged(collate_fn, batch_size is not None), **kwargs)

    def __iter__(self):
        ds = self.dataset
        plan = ds._begin(self.num_workers)
        # the workers (or, with num_workers=0, the fetcher here) take this plan
        # as they start, inside DataLoader.__iter__
        ds._loader_plan = plan
        try:
            batches = super().__iter__()
        finally:
            ds._loader_plan = None
        return self._counted(batches, ds._consumed)

    @staticmethod
    def _counted(batches, consumed):
        for worker, n, batch in batches:
            consumed[worker] += n
            yield batch

    def __len__(self):
        """Batches this rank gets per epoch: each worker's last batch may be short."""
        n, b, workers = len(self.dataset), self.batch_size, max(1, self.num_workers)
        if b is None:
            return n
        counts = (len(range(w, n, workers)) for w in range(workers))
        return sum(c // b if self.drop_last else -(-c // b) for c in counts)

    def state_dict(self):
        return self.dataset.state_dict()

    def load_state_dict(self, state):
        self.dataset.load_state_dict(state)
