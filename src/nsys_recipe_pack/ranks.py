"""Which rank each loaded process is, decided once over the whole run (the README's straggler_heatmap section)."""

from __future__ import annotations

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
