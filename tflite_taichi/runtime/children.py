"""Processes we start must not outlive the process that started them: a compile worker left
behind holds a GPU context and memory, a batch worker would write parts into a folder that a
rerun owns."""
import os
import signal
from typing import Optional


def die_with_parent(parent_pid: Optional[int]) -> None:
    """Called first thing in a child: on Linux the kernel SIGKILLs this process when its parent
    dies, however it dies (PR_SET_PDEATHSIG); if the parent (`parent_pid`, when known) is
    already gone, no signal will come, so exit now. Elsewhere nothing is armed."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass                                            # not Linux
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
