"""Fetching packages for Nsight Systems does not depend on what the machine has installed.

A machine whose libssh-4 came from bookworm-security (newer than bookworm main's) made apt pick the
installed version as the one to download, which the pack's lists did not hold. The machine's dpkg status is
simulated with APT_CONFIG (a config file apt reads before any -o option) naming a status file that says
libssh-4 99.0 is installed.
"""

import shutil
import subprocess

import pytest

from nsys_recipe_pack import nsys_tool

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get (a Debian machine)")

NEWER_INSTALLED = """Package: libssh-4
Status: install ok installed
Priority: optional
Section: libs
Architecture: amd64
Multi-Arch: same
Version: 99.0-1
Description: the machine's libssh-4, newer than any Debian suite holds

"""


@pytest.fixture()
def machine_with_newer_libssh(tmp_path, monkeypatch):
    status = tmp_path / "machine-status"
    status.write_text(NEWER_INSTALLED)
    config = tmp_path / "apt.conf"
    config.write_text(f'Dir::State::status "{status}";\n')
    monkeypatch.setenv("APT_CONFIG", str(config))
    return tmp_path


def test_libssh_is_fetched_whatever_version_the_machine_has(machine_with_newer_libssh):
    work = machine_with_newer_libssh / "work"
    work.mkdir()
    sources = [f"{nsys_tool._mirror()} bookworm main"]
    debs = nsys_tool.download_debs(["libssh-4"], sources, work, log=lambda m: None)
    got = sorted(p.name for p in debs.glob("*.deb"))
    assert len(got) == 1 and got[0].startswith("libssh-4_0.") and "99.0" not in got[0], got
    # the same lists with the machine's status, as the fetch was made before: apt wants the installed version
    apt = work / "apt"
    res = subprocess.run(["apt-get", "-q", f"-o=Dir::Etc::SourceList={apt / 'sources.list'}",
                          "-o=Dir::Etc::SourceParts=/dev/null", f"-o=Dir::State::Lists={apt / 'lists'}",
                          f"-o=Dir::Cache={apt / 'cache'}", "-o=APT::Sandbox::User=root", "download", "libssh-4"],
                         cwd=work, capture_output=True, text=True)
    assert res.returncode != 0 and "99.0-1" in res.stderr, res.stderr
