"""The Python processes we start, started so that they trust what their caller trusts and nothing
more, and so that they do not outlive the process that started them.

What a child imports: `python -m MODULE` and multiprocessing's spawn (`python -c ...`) put the
current folder first on the child's sys.path before anything of ours runs, so a `select.py` or
`pickle.py` that someone else left in the folder a user runs from would run as that user in every
child. Our children run `python -c BOOTSTRAP ENTRY ARGS` instead (`python_command`): the bootstrap
drops that entry before its first import, on every Python version (3.9 and 3.10 have no `-P`),
and the child keeps the user's PYTHONPATH, site-packages and environment. A child that needs more
than a pipe of bytes (a batch worker, a testing backend) gets a multiprocessing Connection over
an inherited socket (`ConnectedChild`) and the caller's absolute sys.path entries through it, as
multiprocessing's spawn gives them, without the relative ones ('' is the current folder).

A compile worker left behind holds a GPU context and memory, a batch worker would write parts into
a folder that a rerun owns: each child asks the kernel to kill it when its parent dies."""
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
from typing import Optional

from tflite_taichi.runtime.session import SESSION

# Runs before any import can read the current folder: '' is sys.path[0] for `python -c` unless
# the user made the path safe already (PYTHONSAFEPATH on 3.11+), and then it is not there.
BOOTSTRAP = (
    "import sys\n"
    "if not (sys.flags.isolated or getattr(sys.flags, 'safe_path', False)):\n"
    "    del sys.path[0]\n"
    "import importlib\n"
    "module, _, function = sys.argv[1].partition(':')\n"
    "sys.exit(getattr(importlib.import_module(module), function)(sys.argv[1:]))\n")

# A script (the backend probe, bench's child) run by its path, as `python SCRIPT ARGS` would, but
# with neither the current folder nor the script's own folder (ours: its module names would shadow
# others') on sys.path.
SCRIPT_BOOTSTRAP = (
    "import sys\n"
    "if not (sys.flags.isolated or getattr(sys.flags, 'safe_path', False)):\n"
    "    del sys.path[0]\n"
    "del sys.argv[0]\n"
    "import runpy\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")

def python_command(entry: str, *args) -> list:
    """The command line of a child of ours that calls `entry` ("package.module:function") with
    [entry, *args] as its argv, without the current folder on its sys.path."""
    return [sys.executable, "-c", BOOTSTRAP, entry, *[str(a) for a in args]]


def python_script_command(script: str, *args) -> list:
    """The command line that runs the Python file `script` with [script, *args] as its argv,
    without the current folder (or the script's) on its sys.path."""
    return [sys.executable, "-c", SCRIPT_BOOTSTRAP, script, *[str(a) for a in args]]


def die_with_parent(parent_pid: Optional[int]) -> None:
    """Called first thing in a child: on Linux the kernel SIGKILLs this process when its parent
    dies, however it dies (PR_SET_PDEATHSIG); if the parent (`parent_pid`, when known) is
    already gone, no signal will come, so exit now. Elsewhere nothing is armed."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass                                            # not Linux
    _exit_if_orphaned(parent_pid)


def _exit_if_orphaned(parent_pid: Optional[int]) -> None:
    """Exit now if the process that started this one (`parent_pid`, when known) is gone."""
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def parent_pid() -> Optional[int]:
    """The pid of the process that started this one as a ConnectedChild (None: not one)."""
    return SESSION.parent_pid


def exit_if_parent_gone() -> None:
    """Where PR_SET_PDEATHSIG is not there: a child whose parent died exits before it writes."""
    _exit_if_orphaned(SESSION.parent_pid)


def importable_path() -> list:
    """This process's sys.path as a child may take it: absolute entries only (a relative one, ''
    above all, would be read against the child's current folder)."""
    return [p for p in sys.path if p and os.path.isabs(p)]


class ConnectedChild:
    """`target(connection, *args)` run in a new Python process (python_command), with the other
    end of `conn` and this process's importable sys.path; `target` must be importable by name
    (module-level). The process: pid, is_alive(), join(), kill(), exitcode (negative: the
    signal that killed it). Its death closes its end of the connection (EOF here)."""

    def __init__(self, target, args: tuple, env: Optional[dict] = None):
        self.conn, theirs = multiprocessing.Pipe()
        fd = theirs.fileno()
        self.process = subprocess.Popen(
            python_command(f"{__name__}:connected_child_main", os.getpid(), fd),
            pass_fds=[fd], env=env)
        theirs.close()                  # its end lives in the child only: its death is our EOF
        self.pid = self.process.pid
        try:
            self.conn.send(importable_path())
            self.conn.send((target, args))
        except OSError:
            pass                        # it died already: is_alive() and EOF say so

    @property
    def exitcode(self) -> Optional[int]:
        return self.process.poll()

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def join(self, timeout: Optional[float] = None) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()


def connected_child_main(argv) -> int:
    """A ConnectedChild: argv [entry, PARENT_PID, FD]."""
    SESSION.parent_pid = int(argv[1])
    die_with_parent(SESSION.parent_pid)
    fd = int(argv[2])
    os.set_inheritable(fd, False)       # not handed on to what this child starts
    conn = multiprocessing.connection.Connection(fd)
    sys.path[:] = conn.recv()           # before the target's pickle is read: it imports it
    target, args = conn.recv()
    target(conn, *args)
    return 0
