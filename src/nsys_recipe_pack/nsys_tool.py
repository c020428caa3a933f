"""Finding a usable `nsys`, and fetching one from Debian's non-free archive when none is installed.

Nothing here is installed system-wide: packages are downloaded with a private apt configuration and
unpacked into the pack's cache, laid out as ROOT/target-linux-x64 and ROOT/host-linux-x64.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInputError, MissingToolError, UsageError
from .staging import staged_output

DEFAULT_VERSION = "2023.4"

# Debian suite and package version for each supported Nsight Systems release.
RELEASES = {
    "2023.4": {"suite": "trixie", "version": "2023.4.4.54~12.4.1-2", "extra": []},
    "2024.2": {
        "suite": "experimental",
        "version": "2024.2.3.38~12.5.0-2+b1",
        "extra": [("libarrow500", "0~~12.5.0-2+b1"), ("libparquet500", "0~~12.5.0-2+b1")],
    },
}
INSTALL_GLOBS = [
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",
]
DEBIAN_SOURCES = "/etc/apt/sources.list.d/debian.sources"
FALLBACK_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nsys-recipe-pack"


def nsys_cache_dir(version: str) -> Path:
    return cache_root() / "nsys" / version


@dataclass(frozen=True)
class Nsys:
    path: Path
    version: str  # e.g. "2023.4.4.54"
    source: str  # how it was found

    @property
    def release(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def target_dir(self) -> Path:
        return self.path.resolve().parent

    @property
    def importer(self) -> Path:
        """The host side's program that turns a capture (.qdstrm) into a report (.nsys-rep)."""
        return self.target_dir.parent / "host-linux-x64" / "QdstrmImporter"

    @property
    def has_host_side(self) -> bool:
        """Whether this install can make reports."""
        return self.importer.exists()

    def recipe_python_path(self) -> Path | None:
        p = self.target_dir / "python" / "packages"
        return p if (p / "nsys_recipe").is_dir() else None


@functools.lru_cache(maxsize=32)
def _version_of(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingToolError(f"{path}: cannot run nsys ({exc}); run `nsys-recipe setup-nsys`") from exc
    m = re.search(r"(\d{4}\.\d+\.\d+(?:\.\d+)?)", out.stdout + out.stderr)
    if out.returncode != 0 or not m:
        raise MissingToolError(
            f"{path}: `nsys --version` failed ({(out.stderr or out.stdout).strip()[:200]}); "
            "run `nsys-recipe setup-nsys`"
        )
    return m.group(1)


def _candidates(explicit: str | None):
    if explicit:
        yield explicit, "--nsys"
    if os.environ.get("NSYS"):
        yield os.environ["NSYS"], "$NSYS"
    on_path = shutil.which("nsys")
    if on_path:
        yield on_path, "PATH"
    for pattern in INSTALL_GLOBS:
        for hit in sorted(glob.glob(pattern), reverse=True):
            yield hit, "install folder"
    for version in sorted(RELEASES):
        cached = nsys_cache_dir(version) / "target-linux-x64" / "nsys"
        if cached.exists():
            yield str(cached), "pack cache"


def find_nsys(explicit: str | None = None, required: bool = True) -> Nsys | None:
    """The first working nsys: --nsys, $NSYS, PATH, the usual install folders, then the pack's cache (_candidates)."""
    for path, source in _candidates(explicit):
        p = Path(path)
        if p.is_dir():
            for sub in ("target-linux-x64/nsys", "bin/nsys", "nsys"):
                if (p / sub).is_file():
                    p = p / sub
                    break
        if not p.is_file() or not os.access(p, os.X_OK):
            if source in ("--nsys", "$NSYS"):
                raise MissingToolError(f"{path}: no executable nsys there (given by {source}); fix the path "
                                       "or run `nsys-recipe setup-nsys`")
            continue
        return Nsys(p, _version_of(str(p)), source)
    if required:
        raise MissingToolError(not_found_message())
    return None


def not_found_message(report: Path | None = None, beside: str = "") -> str:
    """One line for a missing nsys; for a report it was needed for, with what lies beside it (`beside`)."""
    return ((f"{report}: " if report else "") + "no Nsight Systems `nsys` found (looked at --nsys, $NSYS, PATH, "
            f"/opt/nvidia/nsight-systems, /usr/local/cuda/bin, {cache_root()}/nsys)"
            + (f" to export this report; {beside}" if beside else "") + "; run `nsys-recipe setup-nsys`")


# ---------------------------------------------------------------------------------------------------
# setup-nsys


def _mirror() -> str:
    try:
        text = Path(DEBIAN_SOURCES).read_text()
    except OSError:
        return FALLBACK_MIRROR
    for line in text.splitlines():
        if line.startswith("URIs:"):
            uri = line.split(":", 1)[1].split()[0]
            if "security" not in uri:
                return uri.rstrip("/")
    return FALLBACK_MIRROR


def _apt(args: list[str], apt_dir: Path, cwd: Path, log) -> None:
    # A dpkg status of its own (empty): apt would otherwise take the machine's installed version of a
    # package (say libssh-4 from bookworm-security) as the one to download, which the lists here may lack.
    cmd = [
        "apt-get", "-q",
        f"-o=Dir::Etc::SourceList={apt_dir / 'sources.list'}",
        "-o=Dir::Etc::SourceParts=/dev/null",
        f"-o=Dir::State::Lists={apt_dir / 'lists'}",
        f"-o=Dir::State::status={apt_dir / 'status'}",
        f"-o=Dir::Cache={apt_dir / 'cache'}",
        "-o=APT::Sandbox::User=root",
        *args,
    ]
    log(f"$ {' '.join(cmd)}")
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise MissingToolError(f"apt-get {args[0]} failed: {res.stderr.strip()[-400:]}")


def download_debs(packages: list[str], sources: list[str], work: Path, log=print) -> Path:
    """Download Debian packages (NAME or NAME=VERSION) into work/debs with a private apt configuration
    (sources: "URI SUITE COMPONENT" lines) that knows nothing of what this machine has installed."""
    apt_dir = work / "apt"
    for d in ("lists/partial", "cache/archives/partial"):
        (apt_dir / d).mkdir(parents=True)
    (apt_dir / "status").write_text("")
    (apt_dir / "sources.list").write_text("".join(f"deb [signed-by={KEYRING}] {line}\n" for line in sources))
    _apt(["update"], apt_dir, work, log)
    debs = work / "debs"
    debs.mkdir()
    _apt(["download", *packages], apt_dir, debs, log)
    return debs


def setup_nsys(version: str = DEFAULT_VERSION, with_host: bool = False, log=print) -> Path:
    """Fetch and unpack Nsight Systems; return the path of its `nsys`. Idempotent."""
    if version not in RELEASES:
        raise UsageError(f"--version {version}: supported versions are {', '.join(sorted(RELEASES))}")
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise MissingToolError("setup-nsys needs apt-get and dpkg (a Debian-based machine); "
                               "otherwise install Nsight Systems from NVIDIA and pass --nsys")
    rel = RELEASES[version]
    root = nsys_cache_dir(version)
    nsys = root / "target-linux-x64" / "nsys"
    host_ok = (root / "host-linux-x64" / "QdstrmImporter").exists()
    if nsys.exists() and (host_ok or not with_host):
        log(f"Nsight Systems {version} already set up in {root}")
        return nsys

    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".setup-{version}-", dir=root.parent))
    try:
        mirror = _mirror()
        pkgs = [f"nsight-systems-target={rel['version']}"]
        if with_host:
            pkgs += [f"nsight-systems={rel['version']}", "libssh-4"]
            pkgs += [f"{name}={ver}" for name, ver in rel["extra"]]
        if not Path("/usr/lib/x86_64-linux-gnu/libsqlite3.so.0").exists():
            pkgs.append("libsqlite3-0")
        debs = download_debs(pkgs, [f"{mirror} {rel['suite']} non-free", f"{mirror} bookworm main",
                                    f"{mirror} bookworm-updates main"], work, log)
        unpacked = work / "x"
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(unpacked)], check=True)
        with staged_output(root, replace=True) as staged:  # a half fetched before (target only) is replaced
            _layout(unpacked, staged, with_host)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _version_of.cache_clear()
    log(f"Nsight Systems {version} set up in {root}")
    return nsys


def _layout(unpacked: Path, staged: Path, with_host: bool) -> None:
    libdir = unpacked / "usr/lib/x86_64-linux-gnu"
    target = staged / "target-linux-x64"
    shutil.copytree(libdir / "nsight-systems/target-linux-x64", target, symlinks=True)
    # Debian strips the recipe package's third_party folder; nsys recipe refuses to start without it.
    (target / "python/packages/nsys_recipe/third_party").mkdir(parents=True, exist_ok=True)
    sqlite = target / "libsqlite3.so.0"
    if not sqlite.exists():
        system = Path("/usr/lib/x86_64-linux-gnu/libsqlite3.so.0")
        fetched = libdir / "libsqlite3.so.0"
        src = fetched if fetched.exists() else system
        if sqlite.is_symlink():
            sqlite.unlink()
        shutil.copy2(src.resolve(), sqlite)
    if not with_host:
        return
    host = staged / "host-linux-x64"
    shutil.copytree(unpacked / "usr/lib/nsight-systems/host-linux-x64", host, symlinks=True)
    for name in ("libssh.so", "libssh.so.4"):
        (host / name).unlink(missing_ok=True)
    shutil.copy2((libdir / "libssh.so.4").resolve(), host / "libssh.so.4")
    os.symlink("libssh.so.4", host / "libssh.so")
    for pattern in ("libarrow.so.500*", "libparquet.so.500*"):
        for lib in libdir.glob(pattern):
            dest = host / lib.name
            if lib.is_symlink():
                os.symlink(os.readlink(lib), dest)
            else:
                shutil.copy2(lib, dest)
    pylib = host / "python/lib"
    pylib.mkdir(parents=True, exist_ok=True)
    for name in ("nsysstats.py", "gpustats.py"):
        src = target / "python/lib" / name
        if src.exists() and not (pylib / name).exists():
            shutil.copy2(src, pylib / name)


# ---------------------------------------------------------------------------------------------------
# running nsys


def too_new_message(report: Path, made_by: str | None, nsys: Nsys, beside: str = "") -> str:
    """One line for a report this nsys cannot read because a newer release made it, with both ways out."""
    need = f"Nsight Systems {made_by} or newer" if made_by else "the Nsight Systems that made it (or a newer one)"
    return (f"{report}: report made by {f'Nsight Systems {made_by}' if made_by else 'a newer Nsight Systems'}, "
            f"newer than the nsys found ({nsys.version} at {nsys.path}), which cannot read it"
            + (f"; {beside}" if beside else "")
            + f"; export it with {need} (`nsys export --type sqlite {report}`: the .sqlite it writes beside the "
            f"report is read instead) or pass --nsys PATH of {need}")


def newer_report_error(path: Path, stderr: str, nsys: Nsys) -> BadInputError | None:
    m = re.search(r"created in Nsight Systems version\s*\(?\s*(\d+(?:\.\d+)+)", stderr)
    if "newer than" in stderr or m:
        return BadInputError(too_new_message(path, m.group(1) if m else None, nsys))
    return None


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
HEAP_PAD_TUNABLE = "glibc.malloc.top_pad=67108864"


def nsys_env() -> dict:
    """The environment nsys runs in: its heap in transparent huge pages where the system allows them, grown 64 MiB
    at a time.

    A small report's export spends over a quarter of its CPU time zeroing the 4 KiB pages its heap first touches;
    2 MiB pages and a heap grown in larger steps spare most of that (bench/RESULTS.md, "Cold runs"). A glibc older
    than 2.35 ignores the huge pages; a tunable the user set stays as it is."""
    env = dict(os.environ)
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
    for tunable in (HUGE_PAGES_TUNABLE, HEAP_PAD_TUNABLE):
        if not any(t.startswith(tunable.split("=")[0] + "=") for t in tunables):
            tunables.append(tunable)
    env["GLIBC_TUNABLES"] = ":".join(tunables)
    return env


def run_nsys(nsys: Nsys, args: list[str], report: Path | None = None, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(nsys.path), *args], capture_output=True, text=True, env=nsys_env(), **kw)
    if res.returncode != 0 and report is not None:
        err = newer_report_error(report, res.stderr + res.stdout, nsys)
        if err:
            raise err
        raise BadInputError(
            f"{report}: not a readable Nsight Systems report, perhaps truncated or corrupt (nsys {args[0]}: "
            f"{_last_line(res.stderr or res.stdout)}); copy it again or profile again"
        )
    return res


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no message"


def recipe_env(nsys: Nsys, extra_path: Path | None = None) -> dict:
    """Environment for `nsys recipe`: our interpreter first on PATH, our recipes on NSYS_RECIPE_PATH."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    if extra_path is not None:
        env["NSYS_RECIPE_PATH"] = str(extra_path)
    return env


@functools.lru_cache(maxsize=8)
def builtin_recipes(nsys_path: str) -> dict:
    """Nsight Systems' own recipes, as `nsys recipe --help` lists them: name -> title."""
    res = subprocess.run([nsys_path, "recipe", "--help"], capture_output=True, text=True, timeout=120)
    found = re.findall(r"^\s+([A-Za-z0-9_]+) -- (.+)$", res.stdout + res.stderr, flags=re.MULTILINE)
    return dict(found)
