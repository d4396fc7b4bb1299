#!/usr/bin/env python3
"""Interrupts `smelt compile` while it writes the plan, then checks that the
temporary file is gone and no plan was written.

    compile_interrupted.py SIGNAL OUTDIR SMELT ARGS...

The compile runs with SMELT_PLAN_WRITE_TEST_PAUSE (plan/plan_write.c), which
waits once the temporary `OUT.tmp-PID-N` is written; the signal is sent as
soon as that file appears. The command must die by the signal."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import time

signal_name, out, smelt, *args = sys.argv[1:]
number = getattr(signal, signal_name)
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
plan = os.path.join(out, "model.plan")
env = dict(os.environ, SMELT_PLAN_WRITE_TEST_PAUSE="20")


def default_signals():
    # lit (and a shell's background job) may start us with SIGINT ignored, and
    # an ignored signal stays ignored across exec: give smelt the defaults.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


child = subprocess.Popen([smelt, "compile", *args, "-o", plan], env=env, preexec_fn=default_signals)
deadline = time.monotonic() + 60
while not glob.glob(plan + ".tmp-*"):
    if child.poll() is not None or time.monotonic() > deadline:
        child.kill()
        sys.exit("no temporary plan appeared (exit status %s)" % child.poll())
    time.sleep(0.02)
child.send_signal(number)
status = child.wait(timeout=60)
left = sorted(os.listdir(out))
print("status %d, left: %s" % (status, " ".join(left) if left else "nothing"))
sys.exit(0 if status == -number and not left else 1)
