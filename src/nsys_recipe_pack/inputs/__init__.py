"""Everything between the files a user names and the per-rank data a recipe analyses.

Every recipe sees the same normalised frames (`RankData`) whatever the input was: a `.nsys-rep` or `.qdrep`
(exported through nsys to Arrow or Parquet files, cached by the report's name, size, mtime and the nsys
version), an `nsys export --type sqlite` file, or an `nsys export --type parquetdir` folder. A report with a
complete export beside it (`X.sqlite`, `X_pqtdir/`, `X.parquetdir/` next to `X.nsys-rep`) is read from that
export: no nsys is needed, and a report newer than the nsys found can still be used.

One module a step: `discovery` (which files), `export` (nsys export and its cache), `readers` (one Arrow read
path for SQLite, Parquet and Arrow files, the string table), `events` (event tables into frames), `frames` (the
columns analyses get), `rank_data` (one rank, loaded).
"""

from .discovery import expand_inputs, input_kind, report_stem
from .export import export_beside, export_cache_dir
from .frames import (
    Frame,
    NameIds,
    arrow_of,
    dictionary_column,
    numpy_of,
    ranked_tables,
    read_arrow_streams,
    sorted_place,
    strings_of,
    write_arrow_streams,
)
from .rank_data import RankData, load_file
from .read_progress import check_memory
from .readers import TABLES, ExportSource, StringTable

__all__ = ["TABLES", "ExportSource", "Frame", "NameIds", "RankData", "StringTable", "arrow_of", "check_memory",
           "dictionary_column", "expand_inputs", "export_beside", "export_cache_dir", "input_kind",
           "load_file", "numpy_of", "ranked_tables", "read_arrow_streams", "report_stem", "sorted_place",
           "strings_of", "write_arrow_streams"]
