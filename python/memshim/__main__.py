"""`python -m memshim`: the library's path, and memshim-ctl's commands.

    python -m memshim lib                 absolute path of libmemshim.so
    python -m memshim run [OPTS] -- CMD   run CMD with the shim preloaded
    python -m memshim COMMAND ...         any memshim-ctl command (stats, purge, ...)
    python -m memshim --version

Everything but `lib` is memshim-ctl itself: this process becomes it (exec),
so the pid, stdio, output and exit status are memshim-ctl's, and `run`
then becomes CMD. The `memshim-ctl` command that pip puts on PATH is the
same program.
"""

import os
import sys

from . import __version__, ctl, lib

USAGE = """usage: python -m memshim lib
       python -m memshim run [OPTIONS] -- CMD [ARGS...]
       python -m memshim COMMAND [ARGS...]   (any memshim-ctl command; see --help below)
       python -m memshim --version

  lib    print the absolute path of the libmemshim.so this package carries,
         e.g. for LD_PRELOAD=$(python -m memshim lib) or a Dockerfile's
         RUN ln -s "$(python -m memshim lib)" /usr/local/lib/libmemshim.so
  run    the same as `memshim-ctl run`: preload the shim into CMD
"""


def _write(stream, text):
    """Writes `text` to `stream` (sys.stdout or sys.stderr); False where it
    cannot be written: a stream closed when Python started (`>&-`) is None,
    a closed pipe or a full disk fails. A failed stream is pointed at
    /dev/null, so that Python's own flush at exit has nothing to report."""
    if stream is None:
        return False
    try:
        stream.write(text)
        stream.flush()
        return True
    except (OSError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return False


def _error(text):
    _write(sys.stderr, "memshim: error: %s\n" % text)


def exec_ctl(args):
    """Replaces this process with the packaged memshim-ctl."""
    try:
        exe = ctl()
    except FileNotFoundError as e:
        _error(e)
        return 3
    # A stream closed when Python started (`>&-`) is None here: nothing to
    # flush; memshim-ctl reports what it cannot write itself.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    # argv[0] as the user knows the command; memshim-ctl finds the library
    # from /proc/self/exe (../lib/libmemshim.so beside the real binary).
    try:
        os.execv(exe, ["memshim-ctl"] + list(args))
    except OSError as e:
        _error("cannot run %s: %s" % (exe, e))
        return 126


def ctl_main():
    """Entry point of the `memshim-ctl` console script."""
    return exec_ctl(sys.argv[1:])


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        # A usage error: on stderr, like memshim-ctl's own.
        _write(sys.stderr, USAGE)
        return 2
    # What this module prints itself: exit 1 where stdout cannot take it, as
    # memshim-ctl does ("writing to stdout").
    if args[0] in ("-h", "--help", "help"):
        if not _write(sys.stdout, USAGE + "\nmemshim-ctl's commands:\n\n"):
            return 1
        return exec_ctl(["--help"])
    if args[0] in ("-V", "--version", "version"):
        return 0 if _write(sys.stdout, "memshim %s\n" % __version__) else 1
    if args[0] == "lib":
        if len(args) != 1:
            _error("`lib` takes no arguments")
            return 2
        try:
            path = lib()
        except FileNotFoundError as e:
            _error(e)
            return 3
        # The path as bytes: a name the locale cannot encode is still the
        # path a shell hands to LD_PRELOAD.
        out = getattr(sys.stdout, "buffer", None)
        if out is None:
            return 0 if _write(sys.stdout, path + "\n") else 1
        return 0 if _write(out, os.fsencode(path) + b"\n") else 1
    return exec_ctl(args)


if __name__ == "__main__":
    sys.exit(main())
