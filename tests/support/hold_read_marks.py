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
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 123, 0)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
