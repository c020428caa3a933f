"""nsys-recipe-pack: multi-rank Nsight Systems recipes, Parquet tables and notebooks."""

__version__ = "0.1.0"
