"""Holds a SQLite WAL database's read marks from another process, as a second gateway on
the file or a tool reading it would: an exclusive lock on the `-shm` file's read-mark
bytes (123-127) for SECONDS, "locked" printed once it is held.

Usage: python3 hold_read_marks.py DB-SHM-FILE SECONDS

A reader of the database then meets SQLITE_PROTOCOL's retry (which sleeps between tries
whatever the busy timeout, up to ~10 s) until the lock goes. Used by the store's and the
api suite's tests of what such a read must not hold.
"""

import fcntl
import os
import sys
import time

fd = os.open(sys.argv[1], os.O_RDWR)
# A reader of the database (the gateway's own, in the api suite) holds one of the marks
# shared while it reads: tried again until it lets go, for at most 5 s.
deadline = time.monotonic() + 5
while True:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 123, 0)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.005)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
