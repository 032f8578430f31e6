#!/usr/bin/python3
"""A stand-in for bench/torch_train.py in tests/test_bench_train.sh: speaks
the same protocol. FAKE_MODE=kill: SIGKILLs itself at the first "run" (as
the OOM killer would). FAKE_MODE=fast: reports impossibly fast steps (so
the bench must raise its peak), after checking that it is the bench's only
child process (one side's process at a time)."""
import os
import signal
import sys

print("ready", flush=True)
for line in sys.stdin:
    if line.startswith("run"):
        if os.environ.get("FAKE_MODE") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        ppid = os.getppid()
        with open(f"/proc/{ppid}/task/{ppid}/children") as f:
            kids = f.read().split()
        if kids != [str(os.getpid())]:
            print(f"error another side is alive: children of the bench {kids}", flush=True)
            sys.exit(1)
        print("times 0.000001", flush=True)
    elif line.startswith("mem"):
        print("maxrss 1000000", flush=True)
    elif line.startswith("quit"):
        break
