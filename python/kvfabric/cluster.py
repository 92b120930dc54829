"""LocalCluster: a placement service and cache-host daemons on this machine,
on loopback, to try kvfabric (and for tests). Not a deployment: docs/operations.md
says how to run the daemons for real.

    with kvfabric.LocalCluster(daemons=2, host_pool_bytes=256 << 20) as cluster:
        client = kvfabric.Client(placement_address=cluster.placement_address,
                                 security=kvfabric.Security(insecure=True), ...)

The binaries ``kvfabric-placement`` and ``kvfabric-cached`` are taken from
``bin_dir``, else ``$KVFABRIC_BIN_DIR``, else ``PATH``. Each daemon writes its
log in the cluster's temporary directory; a daemon that exits or is not ready
in ``ready_timeout`` seconds fails start-up with its log's tail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import List, Optional, Sequence

from kvfabric.errors import FailedPrecondition, Unavailable


def _binary(name: str, bin_dir: Optional[str]) -> str:
    for d in (bin_dir, os.environ.get("KVFABRIC_BIN_DIR")):
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    found = shutil.which(name)
    if not found:
        raise FailedPrecondition(9, f"{name} not found in bin_dir, $KVFABRIC_BIN_DIR or PATH")
    return found


class LocalCluster:
    """One placement service and ``daemons`` cache hosts on 127.0.0.1;
    ``daemon_args`` are added to every cache host's command line (e.g.
    ``["--compact-threads=1"]`` for compact copies, docs/compact.md)."""

    def __init__(
        self,
        daemons: int = 1,
        host_pool_bytes: int = 64 << 20,
        host_page_bytes: int = 64 << 10,
        data_transport: str = "ucx",
        bin_dir: Optional[str] = None,
        ready_timeout: float = 60.0,
        daemon_args: Sequence[str] = (),
    ) -> None:
        self._placement_bin = _binary("kvfabric-placement", bin_dir)
        self._cached_bin = _binary("kvfabric-cached", bin_dir)
        self._daemons = daemons
        self._host_pool_bytes = host_pool_bytes
        self._host_page_bytes = host_page_bytes
        self._data_transport = data_transport
        self._ready_timeout = ready_timeout
        self._daemon_args = list(daemon_args)
        self._dir: Optional[tempfile.TemporaryDirectory] = None
        self._procs: List[subprocess.Popen] = []
        self.placement_address = ""
        self.host_ids: List[str] = []

    def _start(self, name: str, argv: List[str]) -> dict:
        assert self._dir is not None
        ready = os.path.join(self._dir.name, name + ".ready")
        log_path = os.path.join(self._dir.name, name + ".log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv + [f"--ready-file={ready}"], stdout=log,
                                    stderr=subprocess.STDOUT)
        self._procs.append(proc)
        deadline = time.monotonic() + self._ready_timeout
        while time.monotonic() < deadline:
            if os.path.exists(ready) and os.path.getsize(ready) > 0:
                with open(ready) as f:
                    return dict(line.strip().split("=", 1) for line in f if "=" in line)
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:]
        self.stop()
        raise Unavailable(14, f"{name} did not become ready ({argv[0]}): {tail}")

    def start(self) -> "LocalCluster":
        self._dir = tempfile.TemporaryDirectory(prefix="kvfabric-cluster.")
        common = ["--insecure", "--grpc-address=127.0.0.1:0", "--metrics-address=off",
                  "--log-level=warn"]
        ready = self._start("placement", [self._placement_bin] + common)
        self.placement_address = ready["grpc"]
        for i in range(self._daemons):
            host_id = f"local-{i}"
            self._start(f"cache-{i}", [
                self._cached_bin, f"--host-id={host_id}", "--transport-address=127.0.0.1:0",
                "--lock-memory=off", f"--host-pool-bytes={self._host_pool_bytes}",
                f"--host-page-bytes={self._host_page_bytes}",
                f"--data-transport={self._data_transport}",
                f"--placement-address={self.placement_address}"] + common + self._daemon_args)
            self.host_ids.append(host_id)
        return self

    def kill_daemon(self, index: int) -> None:
        """Kills cache host ``index`` (SIGKILL), as a crash would."""
        proc = self._procs[1 + index]
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
