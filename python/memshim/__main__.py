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


def exec_ctl(args):
    """Replaces this process with the packaged memshim-ctl."""
    try:
        exe = ctl()
    except FileNotFoundError as e:
        sys.stderr.write("memshim: error: %s\n" % e)
        return 3
    sys.stdout.flush()
    sys.stderr.flush()
    # argv[0] as the user knows the command; memshim-ctl finds the library
    # from /proc/self/exe (../lib/libmemshim.so beside the real binary).
    try:
        os.execv(exe, ["memshim-ctl"] + list(args))
    except OSError as e:
        sys.stderr.write("memshim: error: cannot run %s: %s\n" % (exe, e))
        return 126


def ctl_main():
    """Entry point of the `memshim-ctl` console script."""
    return exec_ctl(sys.argv[1:])


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        # A usage error: on stderr, like memshim-ctl's own.
        sys.stderr.write(USAGE)
        return 2
    if args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        sys.stdout.write("\nmemshim-ctl's commands:\n\n")
        return exec_ctl(["--help"])
    if args[0] in ("-V", "--version", "version"):
        sys.stdout.write("memshim %s\n" % __version__)
        return 0
    if args[0] == "lib":
        if len(args) != 1:
            sys.stderr.write("memshim: error: `lib` takes no arguments\n")
            return 2
        try:
            sys.stdout.write(lib() + "\n")
        except FileNotFoundError as e:
            sys.stderr.write("memshim: error: %s\n" % e)
            return 3
        return 0
    return exec_ctl(args)


if __name__ == "__main__":
    sys.exit(main())
