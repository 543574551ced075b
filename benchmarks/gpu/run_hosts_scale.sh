#!/bin/bash
# benchmarks/hosts_scale.py on the 32-core GPU host, where the 64 simulated hosts' Pythons do not all share two cores:
# does `wait --timeout 0` over 64 hosts stay within 2x of one host (issue 14)? The host has no OpenSSH: carry the
# Debian packages in .deb/ (apt-get download openssh-server openssh-client libwrap0) and they are unpacked into
# /tmp/ssh, never into /. Run from the repo root with .whl/ and .deb/ carried; results in $OUT/hosts-scale.json.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1  # remote pythons need cffi
export PYTHONUNBUFFERED=1
if ! command -v sshd >/dev/null 2>&1; then
  mkdir -p /tmp/ssh && for f in .deb/*.deb; do dpkg -x "$f" /tmp/ssh; done
  export PATH=/tmp/ssh/usr/sbin:/tmp/ssh/usr/bin:$PATH
  export LD_LIBRARY_PATH=/tmp/ssh/lib/x86_64-linux-gnu:/tmp/ssh/usr/lib/x86_64-linux-gnu
fi
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd  # sshd's privilege separation user
ldd "$(command -v sshd)" | grep "not found" && exit 3
sshd -V 2>&1 | head -1; nproc
timeout 300 python3 benchmarks/hosts_scale.py --hosts 64 --servers 8 --runs 3 --json "${OUT:-/tmp}/hosts-scale.json"
