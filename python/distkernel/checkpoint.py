"""Checkpoints of distributed training in a folder: torch's Distributed Checkpoint
(torch.distributed.checkpoint, DCP) storage over a "volume", a local folder or
one that every node shares.

This module owns the layout of a checkpoint root, the commit that makes a
checkpoint complete, the pruning of old ones, and the lock that keeps two runs
out of one root:

    VolumeWriter(root, step=None, keep=3)      a DCP StorageWriter
    VolumeReader(root, step=None)              a DCP StorageReader
    UCVolumeWriter, UCVolumeReader             the managed platform's names
    latest_step(root), complete_steps(root)    what a training loop resumes from
    ExtraState(**values)                       step, data loader, RNG beside the model
    rng_state(), set_rng_state(state)          the RNG states of this process

    root/
      .writer.json                  the run that writes here (run id, host, pid)
      step-00000010/                a complete checkpoint: .metadata + __R_N.distcp
      step-00000020/
      step-00000030.partial-1a2b3c/ being written, or left by a failed save: never read

The ranks write into a partial folder; rank 0 (DCP's coordinator), once every
rank's writes succeeded, writes `.metadata`, fsyncs, and renames the folder to
`step-N`. A reader only ever sees complete folders. See docs/checkpoints.md.
"""

import atexit
import errno
import json
import os
import pickle
import re
import shutil
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

try:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.stateful import Stateful
    from torch.distributed.checkpoint.storage import StorageWriter
except ImportError as exc:  # torch missing, or built without distributed
    raise ImportError(
        "distkernel.checkpoint needs torch with torch.distributed.checkpoint (torch 2.4 or "
        f"later) in this Python environment: {exc}") from exc
if not hasattr(StorageWriter, "storage_meta") or not hasattr(StorageWriter, "reset"):
    raise ImportError(
        f"distkernel.checkpoint needs torch 2.4 or later (its DCP StorageWriter API with "
        f"reset() and storage_meta()); this environment has torch {torch.__version__}")

__all__ = ["VolumeWriter", "VolumeReader", "UCVolumeWriter", "UCVolumeReader",
           "latest_step", "complete_steps", "ExtraState", "rng_state", "set_rng_state",
           "CheckpointVolumeError", "CheckpointLockedError"]

LOCK_NAME = ".writer.json"
METADATA = ".metadata"          # DCP's metadata file: its presence marks a committed folder
_COMPLETE = re.compile(r"^step-(\d+)$")
# a save in progress or abandoned, and an old checkpoint on its way out
_TRANSIENT = re.compile(r"^step-(\d+)\.(partial|deleting)-\w+$")
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class CheckpointVolumeError(OSError):
    """The volume refused a checkpoint: the message names the folder and the OS's reason."""


class CheckpointLockedError(RuntimeError):
    """Another run holds the checkpoint root."""


def _step_name(step):
    return f"step-{step:08d}"


def _as_root(root):
    text = os.fspath(root)
    if "://" in str(text):
        raise ValueError(
            f"{text}: VolumeWriter and VolumeReader write folders (local, or a filesystem every "
            "node mounts); for an object store use torch.distributed.checkpoint's FsspecWriter "
            "and FsspecReader")
    return Path(text).expanduser().absolute()


def complete_steps(root):
    """The steps of ROOT's complete checkpoints, ascending; [] where ROOT does not exist."""
    root = _as_root(root)
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    steps = []
    for name in names:
        m = _COMPLETE.match(name)
        if m and os.path.isfile(os.path.join(root, name, METADATA)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_step(root):
    """The step of ROOT's newest complete checkpoint, or None where there is none
    (or no ROOT): where a training loop starts."""
    steps = complete_steps(root)
    return steps[-1] if steps else None


def _fsync_dir(path):
    """Make a folder's entries (a rename, new files) durable; a filesystem that
    cannot fsync a folder (some network ones) is left to its own ordering."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _os_error_in(exc):
    """The OSError behind EXC: torch.save reports a failed write as a RuntimeError
    whose context is the OSError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _size(n):
    return f"{n / 2 ** 30:.1f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def _free_space(path):
    try:
        st = os.statvfs(path)
    except OSError:
        return ""
    return (f" ({_size(st.f_bavail * st.f_frsize)} free of {_size(st.f_blocks * st.f_frsize)} "
            "there now)")


def _volume_error(exc, doing, folder):
    """A CheckpointVolumeError for EXC, which DOING in FOLDER raised: the folder,
    the OS's reason and what it means, or None where EXC is no OS error."""
    os_err = _os_error_in(exc)
    if os_err is None:
        return None
    reason = os.strerror(os_err.errno)
    if os_err.errno in _FULL_ERRNOS:
        reason += (": the volume has no room for it" + _free_space(folder) +
                   ", or a quota or file size limit refused it")
    elif os_err.errno == errno.EROFS:
        reason += ": the filesystem is mounted read-only"
    elif os_err.errno in (errno.EACCES, errno.EPERM):
        reason += f": the folder is not writable by this process (uid {os.geteuid()})"
    where = f" ({os_err.filename})" if getattr(os_err, "filename", None) else ""
    return CheckpointVolumeError(
        os_err.errno, f"{doing} {folder}: {reason}{where}; the complete checkpoints already "
                      "there are untouched")


# ---------------------------------------------------------------- the lock


def _run_id():
    """This run's id: torchrun and distkernel give every run one, the same in each
    restart of it; a process started some other way is a run of its own."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or f"process-{socket.gethostname()}-{os.getpid()}"


def _proc_stat(pid):
    """(state, start time in clock ticks since boot) of PID from Linux's /proc,
    or (None, None): the start time tells a reused pid, the state a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None, None


def _pid_alive(pid, ticks):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                          # another user's process: alive
    state, now = _proc_stat(pid)
    if state == "Z":
        return False                  # ended, not yet reaped by its parent
    return ticks is None or now is None or now == ticks


def _read_record(path):
    """The lock record at PATH; None where there is none, {} where it is unreadable
    (a holder still writing it is given a moment first)."""
    for _ in range(10):
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            return None
        try:
            record = json.loads(text)
            if isinstance(record, dict):
                return record
        except ValueError:
            pass
        time.sleep(0.05)
    return {}


class _Lock:
    """The record in ROOT/.writer.json of the run that writes ROOT, taken by DCP's
    coordinator at each save's set-up and kept fresh by a thread while this process
    lives, so that a run on another host can tell a live holder from a lost one."""

    held = {}                        # root -> _Lock, in this process
    guard = threading.Lock()

    def __init__(self, root, stale_after):
        self.root, self.path, self.stale_after = root, root / LOCK_NAME, stale_after
        self.record = {"run_id": _run_id(), "host": socket.gethostname(), "pid": os.getpid(),
                       "pid_start": _proc_stat(os.getpid())[1],
                       "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "refreshed": time.time()}
        self.stop = threading.Event()

    @classmethod
    def take(cls, root, stale_after):
        with cls.guard:
            lock = cls.held.get(root)
            if lock is not None and lock.record["pid"] == os.getpid() \
                    and not lock.stop.is_set():
                lock.stale_after = stale_after
                lock._acquire()
                return lock
            lock = cls(root, stale_after)   # a forked child holds nothing of its parent's
            lock._acquire()
            cls.held[root] = lock
            threading.Thread(target=lock._refresh, daemon=True,
                             name=f"checkpoint lock {root}").start()
            return lock

    def _alive(self, other):
        if other.get("host") == socket.gethostname() and isinstance(other.get("pid"), int):
            return _pid_alive(other["pid"], other.get("pid_start"))
        seen = other.get("refreshed")
        return isinstance(seen, (int, float)) and time.time() - seen < self.stale_after

    def _acquire(self):
        for _ in range(20):
            other = _read_record(self.path)
            if other is None:
                if self._create():
                    return
                continue
            if other.get("run_id") == self.record["run_id"]:
                # this run's: a restart of it takes it over; this process, which
                # holds it, writes nothing (the thread keeps it fresh), so that a
                # full volume still lets the save clear what failed saves left
                if other.get("pid") != self.record["pid"]:
                    self._write()
                return
            if other and self._alive(other):
                raise CheckpointLockedError(self._refusal(other))
            # a lost holder's record: move it aside; of two runs doing so at
            # once, one finds it gone and looks again
            aside = self.root / f"{LOCK_NAME}.stale-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(self.path, aside)
                os.unlink(aside)
            except FileNotFoundError:
                pass
        raise CheckpointLockedError(f"checkpoint root {self.root}: could not take its lock "
                                    f"{self.path}: other runs keep taking it")

    def _refusal(self, other):
        seen = other.get("refreshed")
        ago = f", last seen {time.time() - seen:.0f} s ago" if isinstance(seen, (int, float)) \
            else ""
        return (f"checkpoint root {self.root} is held by another run: run "
                f"{other.get('run_id')!r}, pid {other.get('pid')} on host "
                f"{other.get('host')!r}, since {other.get('since')}{ago} (this run is "
                f"{self.record['run_id']!r}). Two runs saving into one root would prune and "
                "overwrite each other's checkpoints: wait for that run to end or stop it, or "
                "save into another root. A holder on another host that is gone lets go "
                f"{self.stale_after:.0f} s after it was last seen; deleting {self.path} "
                "frees the root at once.")

    def _create(self):
        """Write the record where there is none; False where another run got there first."""
        self.record["refreshed"] = time.time()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(self.record, f)
            f.flush()
            os.fsync(f.fileno())
        return True

    def _write(self):
        self.record["refreshed"] = time.time()
        tmp = self.root / f"{LOCK_NAME}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.record, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _ours(self):
        other = _read_record(self.path) or {}
        return (other.get("run_id"), other.get("pid")) == (self.record["run_id"],
                                                           self.record["pid"])

    def _refresh(self):
        while not self.stop.wait(self.stale_after / 3):
            try:
                with _Lock.guard:
                    if not self._ours():
                        self.stop.set()   # taken over (a restart of this run): theirs now
                        return
                    self._write()
            except OSError:
                pass                  # the volume is away for now; the next tick tries again

    @classmethod
    def release_all(cls):
        """At exit: let the roots go that this process still holds."""
        with cls.guard:
            for lock in cls.held.values():
                lock.stop.set()
                try:
                    if lock.record["pid"] == os.getpid() and lock._ours():
                        os.unlink(lock.path)
                except OSError:
                    pass
            cls.held.clear()


atexit.register(_Lock.release_all)


# ---------------------------------------------------------------- writing


@dataclass
class _VolumePlan:
    """A rank's share of one save, from the coordinator: its files' prefix (as
    torch's FileSystemWriter names them), the partial folder and the step."""
    prefix: str
    folder: str
    step: int


# partial folder -> the thread of this process whose save writes it. A thread
# runs one save at a time (dcp.save; async_save's executor has one worker), so
# when a thread starts a save, those it started before are over.
_in_flight = {}


class VolumeWriter(FileSystemWriter):
    """A DCP StorageWriter that saves step STEP as ROOT/step-NNNNNNNN, complete or not
    at all, and keeps the newest KEEP complete checkpoints (None: all).

        dcp.save(state, storage_writer=VolumeWriter(root, step=step, keep=3))

    STEP None numbers the checkpoint one past the newest complete one (1 in an empty
    root). Saving a step that exists replaces it once the new one is complete. Rank
    0 takes the run's lock on ROOT at its first save and checks it at each (see
    docs/checkpoints.md); a holder on another host is taken as gone LOCK_STALE_AFTER
    seconds after it was last seen.
    Other keywords go to torch's FileSystemWriter (thread_count=, sync_files=...).
    After the save, `.step` and `.checkpoint_path` say what every rank saved."""

    def __init__(self, root, step=None, keep=3, *, lock_stale_after=120.0, **options):
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)
                                 or step < 0):
            raise ValueError(f"step must be an int >= 0 or None, not {step!r}")
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep must be an int >= 1 or None (keep all), not {keep!r}")
        if lock_stale_after <= 0:
            raise ValueError(f"lock_stale_after must be > 0 seconds, not {lock_stale_after!r}")
        options.setdefault("overwrite", True)   # the partial folder is always new
        self.root = _as_root(root)
        super().__init__(self.root, **options)
        self.step, self.keep, self.lock_stale_after = step, keep, lock_stale_after
        self._asked_step = step
        self._partial = None

    # -- DCP's protocol, in the order save() calls it

    def reset(self, checkpoint_id=None):
        """A new save; a CHECKPOINT_ID (dcp.save's checkpoint_id=) is a new root."""
        if checkpoint_id:
            self.root = _as_root(checkpoint_id)
        super().reset()
        self.path, self.step = self.root, self._asked_step

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        # dcp.save calls reset() only with a checkpoint_id: a writer used again starts here
        FileSystemWriter.reset(self)
        self.path, self.step, self._partial = self.root, self._asked_step, None
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        if kwargs.get("use_collectives", True) is False:
            raise ValueError("VolumeWriter needs dcp.save's use_collectives=True: its commit "
                             "is rank 0's, after every rank's writes succeeded")
        self.use_collectives = True
        if is_coordinator:
            doing = "cannot save into the checkpoint root"
            self._guard(lambda: self.root.mkdir(parents=True, exist_ok=True), doing, self.root)
            self._guard(lambda: _Lock.take(self.root, self.lock_stale_after), doing, self.root)

    def prepare_local_plan(self, plan):
        return plan                  # the folder is the coordinator's to choose

    def prepare_global_plan(self, plans):
        step = self.step
        if step is None:
            done = complete_steps(self.root)
            step = done[-1] + 1 if done else 1
        me = threading.get_ident()
        for key in [k for k, thread in _in_flight.items() if thread == me]:
            del _in_flight[key]      # a save of this thread that failed: over
        # what failed or crashed saves left goes first: on a full volume, its room
        doing = f"cannot save checkpoint step {step} into the checkpoint root"
        self._guard(self._remove_leftovers, doing, self.root)
        partial = f"{_step_name(step)}.partial-{uuid.uuid4().hex[:12]}"
        self._guard(lambda: (self.root / partial).mkdir(), doing, self.root)
        _in_flight[str(self.root / partial)] = me
        return [replace(plan, storage_data=_VolumePlan(f"__{i}_", partial, step))
                for i, plan in enumerate(plans)]

    def write_data(self, plan, planner):
        share = plan.storage_data
        self.step, self._partial = share.step, share.folder
        self.path = self.root / share.folder
        self._wait_visible(self.path)
        doing = f"rank {self.rank} cannot write checkpoint step {share.step} into"

        def write():
            fut = super(VolumeWriter, self).write_data(plan, planner)
            fut.wait()                # raises what the writes raised
            return fut
        return self._guard(write, doing, self.path)

    def finish(self, metadata, results):
        partial = self.root / self._partial
        self._check_files(partial, results)
        self._guard(lambda: super(VolumeWriter, self).finish(metadata, results),
                    f"cannot finish checkpoint step {self.step} in", partial)
        final = self.root / _step_name(self.step)
        self._guard(lambda: self._commit(partial, final),
                    f"cannot commit checkpoint step {self.step} as", final)
        self.path = final
        _in_flight.pop(str(partial), None)
        try:
            self._prune(final)
            self._remove_leftovers()
        except OSError as e:         # the checkpoint is complete; pruning is a chore
            warnings.warn(f"checkpoint step {self.step} is complete in {final}, but "
                          f"cleaning {self.root} failed: {e}", stacklevel=2)

    def storage_meta(self):
        return StorageMeta(checkpoint_id=str(self.checkpoint_id), save_id=self.save_id)

    @property
    def checkpoint_id(self):
        return self.checkpoint_path if self.step is not None else self.root

    @property
    def checkpoint_path(self):
        """ROOT/step-N of this save (None while the step is still to be numbered)."""
        return None if self.step is None else self.root / _step_name(self.step)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return "://" not in str(checkpoint_id)

    # -- helpers

    @staticmethod
    def _guard(fn, doing, folder):
        """FN(), its OS errors raised again naming FOLDER and what DOING was."""
        try:
            return fn()
        except (CheckpointLockedError, CheckpointVolumeError):
            raise
        except Exception as e:
            err = _volume_error(e, doing, folder)
            if err is None:
                raise
            raise err from e

    def _wait_visible(self, folder, patience=10.0):
        """Wait for the coordinator's new folder to show here: a network
        filesystem may show another host's new entry a moment late."""
        deadline = time.monotonic() + patience
        while not folder.is_dir():
            if time.monotonic() > deadline:
                raise CheckpointVolumeError(
                    errno.ENOENT, f"rank {self.rank} on host {socket.gethostname()} cannot "
                    f"see {folder}, which rank 0 made {patience:.0f} s ago: a checkpoint root "
                    "must be one folder that every node mounts (a shared filesystem), not a "
                    "local path of each node")
            time.sleep(0.1)

    def _check_files(self, partial, results):
        """Every rank's files are in the folder as rank 0 sees it: a rank that wrote
        into a local folder of its own node is caught before the commit."""
        written = {getattr(r.storage_data, "relative_path", None)
                   for rank_results in results for r in rank_results} - {None}
        try:
            present = set(os.listdir(partial))
        except OSError as e:
            raise _volume_error(e, f"cannot list checkpoint step {self.step} in",
                                partial) from e
        missing = sorted(written - present)
        if missing:
            raise CheckpointVolumeError(
                errno.ENOENT, f"checkpoint step {self.step}: {len(missing)} of the files the "
                f"ranks wrote are not in {partial} as rank 0 sees it ({', '.join(missing[:4])}"
                "...): a checkpoint root must be one folder that every node mounts")

    @staticmethod
    def _commit(partial, final):
        """PARTIAL (with its .metadata) becomes FINAL, durably; a FINAL already there
        (the same step saved again) is moved aside first, for _remove_leftovers."""
        _fsync_dir(partial)
        if final.exists():
            os.rename(final, final.with_name(f"{final.name}.deleting-{uuid.uuid4().hex[:12]}"))
        os.rename(partial, final)
        _fsync_dir(final.parent)

    def _prune(self, final):
        """After a commit: the complete checkpoints beyond KEEP (never FINAL) are
        moved aside, for _remove_leftovers, so that none is seen half removed."""
        if self.keep is None:
            return
        steps = sorted((int(m.group(1)), n) for n in os.listdir(self.root)
                       if (m := _COMPLETE.match(n)) and n != final.name
                       and (self.root / n / METADATA).is_file())
        for _, name in steps[:max(0, len(steps) - (self.keep - 1))]:
            os.rename(self.root / name,
                      self.root / f"{name}.deleting-{uuid.uuid4().hex[:12]}")

    def _remove_leftovers(self):
        """Remove the partial folders of failed or crashed saves (not those that a
        save of this process is writing) and the checkpoints on their way out."""
        removed = False
        for name in os.listdir(self.root):
            path = self.root / name
            if _TRANSIENT.match(name) and str(path) not in _in_flight:
                shutil.rmtree(path, ignore_errors=True)
                removed = True
        if removed:
            _fsync_dir(self.root)


# ---------------------------------------------------------------- reading


class VolumeReader(FileSystemReader):
    """A DCP StorageReader of ROOT's newest complete checkpoint, or of step STEP.

        reader = VolumeReader(root)
        dcp.load(state, storage_reader=reader)      # reader.step: what was loaded

    The checkpoint is chosen when the reader is made: a ROOT that does not exist, or
    holds no complete checkpoint (of STEP), is a FileNotFoundError naming it, before
    anything is read. Partial folders are never read. dcp.load's checkpoint_id= is a
    new root."""

    def __init__(self, root, step=None, **options):
        if step is not None and (not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be an int >= 0 or None, not {step!r}")
        self.root, self._asked_step = _as_root(root), step
        self.step = self._choose()
        super().__init__(self.checkpoint_path, **options)

    def _choose(self):
        if not self.root.exists():
            raise FileNotFoundError(errno.ENOENT, f"no checkpoint root {self.root}: it does "
                                    "not exist (on this node: a root must be a folder every "
                                    "node mounts)", str(self.root))
        if not self.root.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"checkpoint root {self.root} is not a "
                                     "folder", str(self.root))
        steps = complete_steps(self.root)
        if self._asked_step is None and steps:
            return steps[-1]
        if self._asked_step in steps:
            return self._asked_step
        partial = sorted(n for n in os.listdir(self.root) if _TRANSIENT.match(n))
        what = "no complete checkpoint" if self._asked_step is None else \
            f"no complete checkpoint of step {self._asked_step} (complete: {steps})"
        extra = f"; unfinished, never loaded: {', '.join(partial[:4])}" if partial else ""
        raise FileNotFoundError(errno.ENOENT, f"checkpoint root {self.root} holds {what}{extra}",
                                str(self.root))

    @property
    def checkpoint_path(self):
        return self.root / _step_name(self.step)

    @property
    def checkpoint_id(self):
        return self.checkpoint_path

    def reset(self, checkpoint_id=None):
        if checkpoint_id:
            self.root = _as_root(checkpoint_id)
            self.step = self._choose()
        super().reset(self.checkpoint_path)

    def read_metadata(self, *args, **kwargs):
        if kwargs.get("rank") is not None:
            raise FileNotFoundError(errno.ENOENT, f"{self.checkpoint_path} has no per-rank "
                                    "metadata: VolumeWriter saves with rank coordination")
        if not (self.checkpoint_path / METADATA).is_file():
            raise FileNotFoundError(errno.ENOENT, f"checkpoint step {self.step} was removed "
                                    f"from {self.root} after this reader chose it (pruned by "
                                    "a writer's keep=?)", str(self.checkpoint_path))
        return super().read_metadata(*args, **kwargs)

    def prepare_local_plan(self, plan):
        # the step this rank chose travels to the coordinator, which checks that
        # every rank chose the same one (a save may complete between two ranks' choices)
        return replace(super().prepare_local_plan(plan), storage_data=self.step)

    def prepare_global_plan(self, plans):
        chosen = sorted({p.storage_data for p in plans})
        if len(chosen) > 1:
            raise RuntimeError(
                f"the ranks chose different checkpoints of {self.root} (steps {chosen}): a "
                "save completed while they chose; pass step= (rank 0's latest_step(root), "
                "broadcast) to VolumeReader")
        return super().prepare_global_plan([replace(p, storage_data=None) for p in plans])

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return "://" not in str(checkpoint_id)


# the managed platform's names (serverless_gpu.data, databricks.air.data)
UCVolumeWriter = VolumeWriter
UCVolumeReader = VolumeReader


# ---------------------------------------------------------------- state beside the model


def _rank_and_world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ExtraState(Stateful):
    """Plain values to save beside the model (step, the data loader's state_dict,
    RNG states), each rank its own: any picklable values.

        extra = ExtraState(step=step, loader=loader.state_dict(), rng=rng_state())
        dcp.save({"model": m, "optim": o, "extra": extra}, storage_writer=...)
        extra = ExtraState()
        dcp.load({"model": m, "optim": o, "extra": extra}, storage_reader=...)
        extra["step"]

    Saving gathers every rank's values (a collective: every rank saves, as DCP
    needs anyway), so a checkpoint of N ranks loads into M: rank r gets the values
    rank r saved, a rank beyond the saved world rank 0's (`saved_world` says how
    many ranks saved; `all_ranks` holds them all)."""

    def __init__(self, **values):
        self.values = dict(values)
        self.saved_world = None
        self.all_ranks = None

    def __getitem__(self, key):
        return self.values[key]

    def __setitem__(self, key, value):
        self.values[key] = value

    def get(self, key, default=None):
        return self.values.get(key, default)

    def state_dict(self):
        rank, world = _rank_and_world()
        every = [None] * world
        if world > 1:
            dist.all_gather_object(every, self.values)
        else:
            every[0] = self.values
        # one blob, alike on every rank: DCP stores it once, and a loader needs
        # no knowledge of what is inside to ask for it
        return {"ranks": pickle.dumps(every)}

    def load_state_dict(self, state_dict):
        every = pickle.loads(state_dict["ranks"])
        rank, _ = _rank_and_world()
        self.all_ranks, self.saved_world = every, len(every)
        self.values = dict(every[rank] if rank < len(every) else every[0])

    def __repr__(self):
        return f"ExtraState({', '.join(f'{k}={v!r}' for k, v in self.values.items())})"


def rng_state():
    """This process's RNG states: Python's, NumPy's global one (where NumPy is
    imported), torch's CPU one and, where CUDA is started, every GPU's."""
    import random
    import sys
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    """Restore what rng_state() returned."""
    import random
    import sys
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state and "numpy" in sys.modules:
        sys.modules["numpy"].random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
