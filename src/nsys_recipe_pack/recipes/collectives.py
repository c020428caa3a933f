"""collectives: every NCCL collective matched across the ranks of its communicator, who arrived last and what the
others waited for, and each rank's parallel groups (collective_match.py does the matching, parallel.py the groups).
"""

from __future__ import annotations

import numpy as np

from .. import collective_match
from ..errors import BadInputError, NotApplicableError
from ..iteration_scan import find_iterations
from ..lazy import pd
from . import Recipe, indented, iteration_and_parallel_options, ms, ms_cell

NEEDS = {"nvtx", *collective_match.NEEDS}


def map_rank(rank_data, options: dict) -> dict:
    rank_data.require("kernel", "collectives")
    it, delimiter = None, None
    try:
        it = find_iterations(rank_data, options.get("iteration"), options.get("iteration_kernel"))
        delimiter = it.delimiter.as_dict()
    except BadInputError:
        if options.get("iteration") or options.get("iteration_kernel"):
            raise
    return {**collective_match.nccl_kernels(rank_data, it), "delimiter": delimiter}


def reduce(per_rank: list[dict], options: dict) -> dict:
    if not any(r["nccl_kernels"].num_rows for r in per_rank):
        raise NotApplicableError(
            f"collectives does not apply: none of the {len(per_rank)} rank(s) ran NCCL kernels (ncclKernel*, "
            "ncclDevKernel*); collectives run by the host (gloo, MPI) leave none to match, and the ranks are one "
            "group of peers")
    m = collective_match.match(per_rank, options)
    hosts = {r["rank"]: r["identity"].get("host") for r in per_rank}
    return {"groups": m.groups, "communicators": m.communicators, "collectives": m.collectives,
            "ranks": _rank_table(m.collectives), "links": _links(m.collectives, hosts), "clock": m.clock,
            "settings": {"groups_source": m.source, "notes": m.notes}}


def _rank_table(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per rank and group kind: collectives it took part in, how often it arrived last, what its peers waited for it."""
    each = collectives[["group", "members", "last_rank", "wait_ns"]].explode("members")
    each = each.rename(columns={"members": "rank"}).astype({"rank": "int64"})
    each["last"] = each["rank"] == each["last_rank"]
    each["waited_for_ns"] = each["wait_ns"].where(each["last"], 0)
    t = each.groupby(["rank", "group"]).agg(collectives=("last", "size"), last_arrivals=("last", "sum"),
                                            waited_for_ns=("waited_for_ns", "sum")).reset_index()
    return t.astype({"collectives": "int64", "last_arrivals": "int64", "waited_for_ns": "int64"})


def _links(collectives: pd.DataFrame, hosts: dict) -> pd.DataFrame:
    """Per communicator, operation and message size class (a power of two): intra- or inter-node, instances, the
    median transfer and algorithm bandwidth."""
    c = collectives.copy()
    c["size_class_bytes"] = c["bytes"].map(lambda b: None if pd.isna(b) or b <= 0 else int(2 ** np.floor(np.log2(b))))
    c["intra_node"] = c["members"].map(lambda m: len({hosts.get(r) for r in m}) == 1)
    t = c.groupby(["communicator", "group", "op", "size_class_bytes", "intra_node"], dropna=False).agg(
        collectives=("seq", "size"), median_transfer_ns=("transfer_ns", "median"),
        median_algbw_gbps=("algbw_gbps", "median")).reset_index()
    t["median_transfer_ns"] = t["median_transfer_ns"].round().astype("int64")
    t["size_class_bytes"] = t["size_class_bytes"].astype("Int64")
    return t


def summary(out) -> list[str]:
    groups = pd.read_parquet(out / "groups.parquet")
    ranks = pd.read_parquet(out / "ranks.parquet")
    lines = [_groups_line(groups)]
    top = ranks.sort_values("waited_for_ns", ascending=False).head(5)
    return lines + indented("peers waited longest for:", pd.DataFrame({
        "rank": top["rank"], "group": top["group"], "last arrivals": top["last_arrivals"],
        "of collectives": top["collectives"], "waited for, ms": top["waited_for_ns"].map(ms_cell)}).to_string(
        index=False))


def _groups_line(groups: pd.DataFrame) -> str:
    source = groups["source"].iat[0] if len(groups) else "one_group"
    if source == "one_group":
        return f"groups: one group of {len(groups)} ranks (no parallel groups found)"
    sizes = ", ".join(f"{k}={int(groups[f'{k}_group'].map(len).max())}" for k in ("tp", "pp", "dp"))
    how = {"nvtx_payload": "from NCCL's NVTX payloads", "inferred": "inferred from the NCCL kernels",
           "--parallel": "as --parallel gives them"}.get(source, source)
    return f"groups: {sizes} ({how})"


def headline(out) -> str:
    groups = pd.read_parquet(out / "groups.parquet")
    ranks = pd.read_parquet(out / "ranks.parquet")
    collectives = pd.read_parquet(out / "collectives.parquet", columns=["wait_ns"])
    worst = ranks.loc[ranks["waited_for_ns"].idxmax()] if len(ranks) else None
    tail = f"; peers waited longest for rank {int(worst['rank'])} ({worst['group']}, {ms(worst['waited_for_ns'])})" \
        if worst is not None and worst["waited_for_ns"] > 0 else ""
    return f"{_groups_line(groups)}; {len(collectives)} collectives matched, {ms(int(collectives['wait_ns'].sum()))} " \
           f"waited{tail}"


RECIPE = Recipe(
    name="collectives",
    display_name="Collectives and parallel groups",
    description="Every NCCL collective matched across its communicator's ranks: who arrived last, what the others "
                "waited, transfer and bandwidth; each rank's tensor, pipeline and data parallel groups.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=iteration_and_parallel_options,
    summary=summary,
    headline=headline,
)
