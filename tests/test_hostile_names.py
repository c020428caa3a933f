"""Names from a profiled application never run as script in a report page, and read as the text they are.

SYNTHETIC exports from the pack's generator get hostile names planted with plain SQL (NVTX ranges, a kernel,
the host, the file and the run folder); every page of `nsys-recipe report` and of `nsys-recipe diff` is
opened in headless Chromium with no network, and its DOM after the scripts ran is checked.
"""

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_report_batch import CHROMIUM, FLAGS

from nsys_recipe_pack import escape, synth


def attack(n: int, tag: str = "img") -> str:
    if tag == "img":
        return f"<img src=x onerror=document.body.dataset.pwned={n}>"
    return f"</script><svg onload=document.body.dataset.pwned={n}>"


RANGES = {  # the synthetic job's names -> what the application called them
    "dataloader": "load " + attack(1),              # stored through textId (StringIds)
    "forward": "fwd `code` **bold** " + attack(2, "svg"),  # stored in NVTX_EVENTS.text
    "backward": "bwd [link](javascript:alert(1)) " + attack(3),
}
KERNEL = ("sgemm_128x64_nn", "k<float> " + attack(4))  # short enough for a figure label (60 characters)
HOST = ("synth-node000", "node" + attack(5))
FILE_PART = attack(6)  # file names cannot hold '/', so no closing tags here
RUN = "job " + attack(7)
ALL_ATTACKS = [attack(n, t) for n, t in [(1, "img"), (2, "svg"), (3, "img"), (4, "img"), (5, "img"), (6, "img"),
                                        (7, "img")]]


def plant(folder: Path) -> None:
    """Rename in every export of folder, as an application that chose these names would have recorded them."""
    for db in sorted(folder.glob("*.sqlite")):
        with sqlite3.connect(db) as con:
            for old, new in [*RANGES.items(), KERNEL]:
                con.execute("update StringIds set value = ? where value = ?", (new, old))
                con.execute("update NVTX_EVENTS set text = ? where text = ?", (new, old))
            con.execute("update TARGET_INFO_SYSTEM_ENV set value = replace(value, ?, ?)", HOST)
        db.rename(db.with_name(f"{db.stem}{FILE_PART}.sqlite"))


def synthetic_run(root: Path, name: str, stragglers) -> Path:
    out = synth.write_synthetic(root / name, ranks=4, iterations=12, fmt="sqlite", seed=3,
                                stragglers=[synth.parse_straggler(s) for s in stragglers])
    plant(out)
    return out


def nsys_recipe(*args) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("nsys-recipe")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    base = synthetic_run(root, "base", [])
    run = synthetic_run(root, RUN, ["rank=2,iterations=3-8,cause=compute,slowdown=3"])
    res = nsys_recipe("report", run, "--output", root / "report")
    assert res.returncode == 0, res.stderr
    res = nsys_recipe("diff", base, run, "--output", root / "diff")
    assert res.returncode in (0, 1), res.stderr  # 1: a tracked metric regressed, as injected
    found = sorted((root / "report").rglob("*.html")) + sorted((root / "diff").rglob("*.html"))
    return root, found


def as_dom_text(name: str) -> str:
    """How a text node holding name is serialised: '&', '<' and '>' as entities, the rest as recorded."""
    return name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def dom_after_scripts(page: Path, profile: Path) -> str:
    res = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=15000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-1000:]
    return res.stdout


def test_the_planted_names_are_in_the_outputs(pages):
    root, found = pages
    names = {p.relative_to(root).as_posix() for p in found}
    for recipe in ("straggler_heatmap", "nvtx_gpu_proj", "sync_summary", "kernel_pace", "compute_memory_share"):
        assert f"report/{RUN}/{recipe}/report.html" in names
    assert {"report/index.html", f"report/{RUN}/overview.html", "diff/report.html"} <= names


@pytest.mark.skipif(CHROMIUM is None, reason="make test installs Debian's chromium; it is not on PATH here")
def test_no_page_runs_a_name_and_every_name_reads_as_text(pages, tmp_path):
    root, found = pages
    doms = {p.relative_to(root).as_posix(): dom_after_scripts(p, tmp_path / "profile") for p in found}
    for page, dom in doms.items():
        assert "data-pwned" not in dom, page
        for bad in ('onerror="document', 'onload="document', '<img src="x"', 'href="javascript'):
            # an element built from a name would be serialised with its attributes quoted
            assert bad not in dom, (page, bad)
    shown = "\n".join(doms.values())
    for name in [*RANGES.values(), KERNEL[1], HOST[1], RUN]:
        assert as_dom_text(name) in shown, name
    assert as_dom_text(HOST[1]) in doms[f"report/{RUN}/straggler_heatmap/report.html"]  # the files table
    assert as_dom_text(FILE_PART) in doms[f"report/{RUN}/straggler_heatmap/report.html"]
    assert as_dom_text(RUN) in doms["report/index.html"]


def test_escaping_by_context():
    name = "a<b>&`*_[x](y)\x1b]0;t\x07"
    assert escape.html_text(name) == "a&lt;b&gt;&amp;`*_[x](y)\x1b]0;t\x07"
    md = escape.markdown_text(name)
    assert "<" not in md and "`" not in md and "*" not in md and "[" not in md and "\x1b" not in md
    assert md.startswith("a&#60;b&#62;&#38;&#96;&#42;&#95;&#91;x&#93;")
    assert escape.markdown_code("x<y") == "<code>x&#60;y</code>"
    assert escape.plotly_text("void k<float>&") == "void k&lt;float&gt;&amp;"
    assert escape.terminal_text(name) == "a<b>&`*_[x](y)\\x1b]0;t\\x07"


def test_chromium_is_a_real_oracle(tmp_path):
    """The same check on a page that does run a planted name: the DOM test above could not pass by accident."""
    if CHROMIUM is None:
        pytest.skip("make test installs Debian's chromium; it is not on PATH here")
    page = tmp_path / "unsafe.html"
    page.write_text(f"<!DOCTYPE html><html><body><p>{RANGES['dataloader']}</p></body></html>")
    assert "data-pwned" in dom_after_scripts(page, tmp_path / "profile")
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)
