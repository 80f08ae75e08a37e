"""Cell sources as files, the way a Python kernel makes them.

Every cell the kernel runs is compiled under a file name made from a hash of
its source, and the source is written to that file:

    <directory>/<murmur2(source, HASH_SEED)>.py

so tracebacks show source lines, `inspect.getsource` works on functions a
notebook defined, and the debugger can set breakpoints in cells. JupyterLab
computes the same name itself from what debugInfo advertises (hashMethod
Murmur2, hashSeed, tmpFilePrefix, tmpFileSuffix): the hash must be murmur2
with that seed, over the UTF-8 of the cell's raw text.

The directory is private: made with mkdtemp (mode 0700, an unpredictable name),
checked to be ours and closed to others, and every file is created relative to
a descriptor of it with O_NOFOLLOW|O_EXCL, so nothing planted there (a symlink,
a file of another owner) can redirect a write. It goes when the kernel shuts
down cleanly.

Ranks may not see these files (other nodes): the payload of a distributed job
carries the sources of the cells its code comes from (`dumps_with_sources`),
and the rank puts them in linecache.
"""

import io
import linecache
import os
import stat
import sys
import tempfile
import threading
import types

HASH_METHOD = "Murmur2"
HASH_SEED = 0x5D15C0DE
SUFFIX = ".py"

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(text, seed=HASH_SEED):
    """MurmurHash2, 32-bit (Austin Appleby's), of TEXT's UTF-8 bytes."""
    data = text.encode("utf-8")
    n = len(data)
    h = (seed ^ n) & _MASK
    whole = n & ~3
    # The words, little-endian as the algorithm reads them.
    for k in memoryview(data[:whole]).cast("I") if sys.byteorder == "little" else (
            int.from_bytes(data[i:i + 4], "little") for i in range(0, whole, 4)):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    if n & 3:
        h ^= int.from_bytes(data[whole:], "little")
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def _tidy(what, path):
    """Have the kernel remove PATH when it ends, even by SIGKILL (what:
    "keep"), or no longer ("forget"; runtime/logs/dk_tidy.h). Outside the
    kernel (a rank, a test) there is nothing to ask."""
    try:
        import _distkernel
    except ImportError:
        return
    try:
        getattr(_distkernel, f"tidy_{what}")(path)
    except OSError as exc:
        _log(f"{path} stays if the kernel is killed: {exc}")


def _log(text):
    try:
        import _distkernel
        _distkernel.log(text)
    except ImportError:
        print(f"[distkernel] {text}", file=sys.stderr)


class CellFiles:
    """The directory of cell files; made on first use."""

    def __init__(self):
        self._dir = None
        self._fd = -1
        self._written = set()   # names this kernel wrote (or found as its own)
        self._warned = False
        self._lock = threading.Lock()   # the debugger's thread writes too (dumpCell)

    @property
    def directory(self):
        with self._lock:
            if self._dir is None:
                self._open()
            return self._dir

    def folder(self):
        """The directory with its separator, or None when no cell file was made
        yet (unlike prefix, it makes none)."""
        with self._lock:
            return None if self._dir is None else self._dir + os.sep

    @property
    def prefix(self):
        return self.directory + os.sep

    def _open(self):
        path = tempfile.mkdtemp(prefix=f"distkernel-cells-{os.getpid()}-")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st, lst = os.fstat(fd), os.lstat(path)
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077
                or (st.st_dev, st.st_ino) != (lst.st_dev, lst.st_ino)):
            os.close(fd)
            raise PermissionError(f"{path} is not a private directory of this user")
        self._dir, self._fd = path, fd
        _tidy("keep", path)

    def name_for(self, code):
        return f"{murmur2(code)}{SUFFIX}"

    def path_for(self, code):
        return self.prefix + self.name_for(code)

    def write(self, code):
        """The file name for CODE, with CODE written there. A failure to write
        is logged once: the name still serves (linecache holds the source)."""
        name = self.name_for(code)
        path = self.prefix + name
        if name not in self._written:
            try:
                self._write(name, code)
                self._written.add(name)
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    _log(f"could not write the cell file {path}: {exc}")
        return path

    def _write(self, name, code):
        data = code.encode("utf-8")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o600, dir_fd=self._fd)
        except FileExistsError:
            if self._is_own_copy(name, data):
                return
            # Something else is there (a symlink, a file of another owner, a
            # hash collision): write beside it and rename over it, which
            # replaces the entry itself and never follows it.
            tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
            fd = os.open(tmp, flags, 0o600, dir_fd=self._fd)
            try:
                _write_all(fd, data)
            except BaseException:
                os.unlink(tmp, dir_fd=self._fd)
                raise
            os.replace(tmp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            return
        _write_all(fd, data)

    def _is_own_copy(self, name, data):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=self._fd)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != len(data):
                return False
            with os.fdopen(os.dup(fd), "rb") as f:
                return f.read() == data
        finally:
            os.close(fd)

    def remove(self):
        """Delete the directory and what is in it (at shutdown)."""
        if self._dir is None:
            return
        import shutil
        try:
            os.close(self._fd)
        except OSError:
            pass
        shutil.rmtree(self._dir, ignore_errors=True)
        _tidy("forget", self._dir)
        self._dir, self._fd = None, -1
        self._written.clear()


def _write_all(fd, data):
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


files = CellFiles()


def folder():
    """The cell files' directory, ending in a separator, or None: what the
    kernel tells cell frames in a rank's stack by (runtime/stacks/dk_stacks.h)."""
    return files.folder()


# The whole text of the native-magic cell running now (%%distributed), so that
# its body is compiled in the ranks under the cell's own file and lines.
native_cell = None


def cache_source(filename, source):
    """Put SOURCE in linecache under FILENAME, where stale-cache checks leave it."""
    entry = (len(source), None, source.splitlines(True), filename)
    linecache.cache[filename] = entry
    if hasattr(linecache, "_ipython_cache"):
        linecache._ipython_cache[filename] = entry


def cell_source(filename):
    """The source of the cell FILENAME names, or None if it is not a cell's."""
    if files._dir is None or not filename.startswith(files.prefix):
        return None
    entry = linecache.cache.get(filename)
    if entry and len(entry) == 4 and entry[2]:
        return "".join(entry[2])
    try:
        fd = os.open(os.path.basename(filename), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=files._fd)
        with os.fdopen(fd, "r", encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _imported_by(code):
    """The top-level names of the modules CODE's own bytecode imports (not
    its nested code objects': the pickler meets those on their own)."""
    import dis

    names = set()
    for ins in dis.get_instructions(code):
        if ins.opname == "IMPORT_NAME":
            names.add(str(ins.argval).split(".")[0] or ".")
    return names


def _tracking_pickler():
    import cloudpickle

    class SourceTrackingPickler(cloudpickle.CloudPickler):
        """Records the file of every code object it pickles by value and, when
        asked (modules is a set), the top-level name of every module the
        unpickling may import: a module itself, the module of a class or a
        function pickled by reference, of an object's type, and what code
        pickled by value imports."""

        modules = None

        def reducer_override(self, obj):
            kind = type(obj)
            if kind is types.CodeType:
                self.code_files.add(obj.co_filename)
                if self.modules is not None:
                    self.modules |= _imported_by(obj)
            elif self.modules is not None:
                if kind is types.ModuleType:
                    name = obj.__name__
                elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
                    name = getattr(obj, "__module__", None) or ""
                else:
                    name = getattr(kind, "__module__", None) or ""
                self.modules.add(name.split(".")[0])
            return super().reducer_override(obj)

    return SourceTrackingPickler


def dumps_with_sources(obj, sources, modules=None):
    """cloudpickle OBJ; add to SOURCES {filename: text} the cells its code
    comes from, and to MODULES (a set, when given) the top-level names of the
    modules unpickling it may import."""
    code_files = set()
    with io.BytesIO() as buf:
        pickler = _tracking_pickler()(buf, protocol=5)
        pickler.code_files = code_files
        pickler.modules = modules
        pickler.dump(obj)
        blob = buf.getvalue()
    for filename in code_files:
        if filename not in sources:
            text = cell_source(filename)
            if text is not None:
                sources[filename] = text
    return blob


def body_location(body):
    """(filename, line offset) under which a %%distributed cell's BODY runs:
    the file of the whole cell when BODY is the body of the native cell running
    now, so lines match what the user sees; else a file of its own."""
    raw = native_cell
    if raw is not None and raw.endswith(body):
        head = raw[:len(raw) - len(body)]
        filename = files.write(raw)
        cache_source(filename, raw)
        return filename, head.count("\n")
    filename = files.write(body)
    cache_source(filename, body)
    return filename, 0


try:
    from IPython.core.compilerop import CachingCompiler
except ImportError:  # a rank without IPython never compiles cells itself
    CachingCompiler = object


class CellCompiler(CachingCompiler):
    """IPython's compiler, naming each cell after its source's file."""

    def get_code_name(self, raw_code, transformed_code, number):
        return files.write(raw_code)
