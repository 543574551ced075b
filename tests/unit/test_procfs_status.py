"""procfs.parse_status: the signal masks and NSpid a kill reads before signalling, from recorded status text."""

from __future__ import annotations

import os
import signal

from nvmlcheck._proc import procfs

# A PyTorch launcher as PID 1 of its namespace seen from the host (NSpid: host PID, namespace PID), SIGTERM ignored.
STATUS = b"""Name:\tpython3
Umask:\t0022
State:\tS (sleeping)
Tgid:\t4123
Ngid:\t0
Pid:\t4123
PPid:\t4100
Uid:\t1000\t1000\t1000\t1000
NStgid:\t4123\t1
NSpid:\t4123\t1
SigQ:\t0/1031010
SigPnd:\t0000000000000000
ShdPnd:\t0000000000000000
SigBlk:\t0000000000010000
SigIgn:\t0000000001004000
SigCgt:\t0000000180000002
"""


def test_masks_and_nspid() -> None:
    st = procfs.parse_status(STATUS)
    assert (st.tgid, st.uid, st.nspid) == (4123, 1000, (4123, 1))
    assert st.sig_ign == 0x1004000 and st.sig_ign & (1 << (signal.SIGTERM - 1))
    assert st.sig_cgt == 0x180000002 and st.sig_cgt & (1 << (signal.SIGINT - 1))
    assert st.sig_blk == 1 << (signal.SIGCHLD - 1)


def test_missing_fields_are_none() -> None:
    st = procfs.parse_status(b"Name:\tx\nTgid:\t7\nSigIgn:\tzz\n")
    assert st.tgid == 7 and st.nspid is None and st.sig_ign is None and st.sig_cgt is None and st.sig_blk is None


def test_this_process() -> None:
    old = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        st = procfs.read_status(os.getpid())
        assert st is not None and st.sig_ign is not None and st.sig_ign & (1 << (signal.SIGUSR2 - 1))
        assert st.nspid is not None and st.nspid[0] == os.getpid()
    finally:
        signal.signal(signal.SIGUSR2, old)
    assert procfs.pidns_inode("self") == os.stat("/proc/self/ns/pid").st_ino
