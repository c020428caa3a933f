"""`make lab` serves the notebooks, also as root (as in a container), with arguments passed through."""

import os
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest
from conftest import ROOT, free_port

pytestmark = pytest.mark.skipif(shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "jupyter").exists(),
                                reason="needs make and the venv that `make test` sets up, with JupyterLab")


def test_make_lab_serves_the_notebooks(tmp_path):
    (tmp_path / "quick.ipynb").write_text((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    port, token = free_port(), "t0ken"
    args = f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --IdentityProvider.token={token}"
    proc = subprocess.Popen(["make", "-C", str(ROOT), "lab", f"LAB_DIR={tmp_path}", f"LAB_ARGS={args}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline, listing = time.time() + 120, None
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=5) as r:
                    listing = r.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert listing is not None, proc.stdout.read() if proc.poll() is not None else "no answer in 120 s"
        assert '"quick.ipynb"' in listing
        with urllib.request.urlopen(f"{base}/lab/tree/quick.ipynb?token={token}", timeout=10) as r:
            assert r.status == 200 and "JupyterLab" in r.read().decode()
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """End make, jupyter and its kernels: the whole session the test started."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # already gone
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
