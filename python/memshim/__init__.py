"""memshim: malloc that gives memory back, for Python and PyTorch processes.

The package carries two binaries, ``libmemshim.so`` (the preload library) and
``memshim-ctl`` (the CLI, on PATH as ``memshim-ctl``), and a small in-process
API::

    python -m memshim lib                # absolute path of libmemshim.so
    python -m memshim run -- python app.py   # same as: memshim-ctl run -- ...

    import memshim
    memshim.stats()     # this process's allocator figures, in bytes
    memshim.purge()     # give free pages back to the OS now; bytes returned

The API talks to the library through the malloc API it exports in place of
glibc's (``malloc_info`` and ``malloc_trim``, looked up in the process's
global scope, where a preloaded library comes first). It works only when the
library was preloaded when the process started; otherwise it raises
:class:`NotPreloadedError`, which says how to start the program.
"""

import ctypes
import os
import re
import tempfile

try:
    from ._version import __version__
except ImportError:  # a source checkout: make wheel writes _version.py
    __version__ = "0+unknown"

__all__ = [
    "NotPreloadedError",
    "__version__",
    "ctl",
    "is_preloaded",
    "lib",
    "loaded_library",
    "purge",
    "stats",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB = os.path.join(_HERE, "lib", "libmemshim.so")
_CTL = os.path.join(_HERE, "bin", "memshim-ctl")

# The figures of malloc_info's document, in the order stats() gives them
# (the same names as `memshim-ctl stats --json`, section "allocator").
_TOTALS = ("allocated", "active", "resident", "dirty", "muzzy", "retained")
_SYSTEM = {"current": "mapped", "metadata": "metadata"}


class NotPreloadedError(RuntimeError):
    """memshim's allocator is not this process's malloc."""


def lib():
    """Absolute path of the libmemshim.so this package carries.

    Put it in ``LD_PRELOAD`` (or let ``python -m memshim run`` do it).
    """
    path = os.path.realpath(_LIB)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            "libmemshim.so is missing from the memshim package at %s; reinstall the wheel" % path
        )
    return path


def ctl():
    """Absolute path of the memshim-ctl executable this package carries."""
    path = os.path.realpath(_CTL)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            "memshim-ctl is missing from the memshim package at %s; reinstall the wheel" % path
        )
    return path


def _maps():
    """(start, end, path) of every file mapping of this process."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                out.append((start, end, parts[5].strip()))
    except OSError:
        pass
    return out


def loaded_library():
    """Path of the libmemshim mapped into this process, or None."""
    for _, _, path in _maps():
        if os.path.basename(path).startswith("libmemshim"):
            return path
    return None


def _global_symbol(name):
    """Address of `name` as the process's global scope resolves it (what
    every call to it from any library reaches), with that library's path."""
    scope = ctypes.CDLL(None)
    try:
        fn = getattr(scope, name)
    except AttributeError:
        return None, None
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    for start, end, path in _maps():
        if start <= addr < end:
            return fn, path
    return fn, None


def _ours(name):
    """The global `name`, if it is memshim's; else NotPreloadedError."""
    fn, path = _global_symbol(name)
    if fn is not None and path and os.path.basename(path).startswith("libmemshim"):
        return fn
    loaded = loaded_library()
    if loaded:
        raise NotPreloadedError(
            "%s is loaded but is not this process's malloc (it was loaded after start-up, "
            "e.g. with ctypes or dlopen): preload it instead, e.g. "
            "`python -m memshim run -- python ...` or LD_PRELOAD=%s" % (loaded, loaded)
        )
    raise NotPreloadedError(
        "memshim is not preloaded in this process: start the program with "
        "`python -m memshim run -- python ...`, `memshim-ctl run -- ...`, or "
        "LD_PRELOAD=$(python -m memshim lib)"
    )


def is_preloaded():
    """True if memshim's allocator is this process's malloc.

    The library answers itself: its constructor asked the dynamic loader
    whose malloc family the process's calls reach, and its malloc_info
    document says ``interposed="yes"`` when that is memshim's.
    """
    try:
        text = _malloc_info(_ours("malloc_info"))
    except NotPreloadedError:
        return False
    return 'interposed="yes"' in text


def _malloc_info(fn):
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    scope = ctypes.CDLL(None)
    fdopen = scope.fdopen
    fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    fdopen.restype = ctypes.c_void_p
    fclose = scope.fclose
    fclose.argtypes = [ctypes.c_void_p]
    fclose.restype = ctypes.c_int
    with tempfile.TemporaryFile() as tmp:
        fd = os.dup(tmp.fileno())
        fp = fdopen(fd, b"w")
        if not fp:
            os.close(fd)
            raise OSError(ctypes.get_errno(), "fdopen failed")
        rc = fn(0, fp)
        fclose(fp)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", "replace")
    if rc != 0:
        raise OSError("malloc_info failed (%d)" % rc)
    return text


def stats():
    """This process's allocator figures, in bytes, as a dict:

    ``allocated``, ``active``, ``resident``, ``dirty``, ``muzzy``,
    ``retained``, ``mapped``, ``metadata`` (defined in memshim's
    docs/stats.md), plus ``purgeable`` (dirty + muzzy: what :func:`purge`
    can return), ``jemalloc_version`` and ``library`` (the mapped file).

    Raises :class:`NotPreloadedError` when memshim is not the process's malloc.
    """
    text = _malloc_info(_ours("malloc_info"))
    if 'interposed="yes"' not in text:
        raise NotPreloadedError(
            "%s is loaded but another allocator is this process's malloc (the program, or a "
            "sanitizer, brings its own): memshim's figures would not be the process's"
            % (loaded_library() or "libmemshim.so")
        )
    out = {}
    for kind, size in re.findall(r'<total type="(\w+)" size="(\d+)"/>', text):
        if kind in _TOTALS:
            out[kind] = int(size)
    for kind, size in re.findall(r'<system type="(\w+)" size="(\d+)"/>', text):
        if kind in _SYSTEM:
            out[_SYSTEM[kind]] = int(size)
    missing = [k for k in _TOTALS + tuple(_SYSTEM.values()) if k not in out]
    if missing:
        raise RuntimeError("malloc_info answered without %s: %r" % (", ".join(missing), text[:200]))
    out["purgeable"] = out["dirty"] + out["muzzy"]
    m = re.search(r'jemalloc="([^"]*)"', text)
    out["jemalloc_version"] = m.group(1) if m else None
    out["library"] = loaded_library()
    return out


def purge():
    """Returns every free page of the allocator to the OS now (what
    ``memshim-ctl purge`` does from outside), and the bytes that left the
    allocator's resident memory (0 when nothing was dirty).

    Raises :class:`NotPreloadedError` when memshim is not the process's malloc.
    """
    trim = _ours("malloc_trim")
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    before = stats()["resident"]
    trim(0)
    after = stats()["resident"]
    return max(0, before - after)
