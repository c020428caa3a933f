"""Which rank each loaded process is, decided once over the whole run (the README's straggler_heatmap section)."""

from __future__ import annotations

import datetime

import numpy as np

from .errors import BadInputError
from .escape import terminal_text
from .lazy import pd

SOURCE_ORDER = ["env", "nvtx", "filename"]


def assign_ranks(identities: pd.DataFrame) -> pd.DataFrame:
    """identities: one row per loaded process with columns file, pid, and a `candidates` dict
    (source -> (rank, detail)). Adds `rank` and `rank_source`.

    A source is used only when it names every process and no two alike; otherwise the next source is
    tried, and the last resort is the sorted position (file, then pid). So a run where every report
    says SLURM_PROCID=0 does not collapse into one rank.
    """
    ids = identities.sort_values(["file", "pid"], kind="mergesort", na_position="first").reset_index(drop=True)
    ids.attrs["notes"] = notes = []
    for source in SOURCE_ORDER:
        values = [c.get(source) for c in ids["candidates"]]
        if all(v is not None for v in values):
            ranks = [int(v[0]) for v in values]
            if len(set(ranks)) == len(ranks):
                ids["rank"] = ranks
                ids["rank_source"] = [source if source != "env" else f"env:{v[1]}" for v in values]
                return ids
            dup = sorted({r for r in ranks if ranks.count(r) > 1})
            notes.append(f"ranks from {source} were not used: they repeat ({', '.join(map(str, dup[:10]))})")
    ids["rank"] = range(len(ids))
    ids["rank_source"] = "position"
    return ids


LAUNCH_WINDOW_NS = 120 * 10**9  # the ranks of one job start within this of each other, whatever programs they run


def programs(ids: pd.DataFrame) -> list[str]:
    """What the processes' programs say of the inputs: nothing where they run one program (or the exports do not
    say); a note where several programs started together (one job of several executables, as MPI runs them); an
    error (BadInputError) where the reports are of different programs started apart: unrelated runs, whose ranks
    must not be compared with one another."""
    named = ids[ids["program"].notna()] if "program" in ids else ids.iloc[:0]
    if named["program"].nunique() < 2:
        return []
    started = named.groupby("program")["session_start_ns"].agg(["min", "max", "size"]).sort_values("min")
    files = named.groupby("program")["file"].agg(lambda f: sorted(set(f)))
    said = [f"{terminal_text(p)} ({int(row['size'])} rank(s): {', '.join(map(terminal_text, files[p][:2]))}"
            f"{', …' if len(files[p]) > 2 else ''}; started {_utc(row['min'])})" for p, row in started.iterrows()]
    apart = (started["min"].to_numpy()[1:] - np.maximum.accumulate(started["max"].to_numpy())[:-1]) > \
        LAUNCH_WINDOW_NS
    if apart.any():
        raise BadInputError("the inputs are reports of different programs started apart, not one job: "
                            + "; ".join(said) + ". Give each run on its own (a folder per run; `nsys-recipe report` "
                            "takes several runs at once)")
    return ["the ranks run different programs, started together (one job of several executables): " + "; ".join(said)]


def _utc(ns) -> str:
    if not ns or ns <= 0:
        return "at an unrecorded time"
    return datetime.datetime.fromtimestamp(int(ns) / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
