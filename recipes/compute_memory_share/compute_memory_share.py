"""compute_memory_share as an Nsight Systems recipe: a thin adapter; the work is done by nsys_recipe_pack."""

from nsys_recipe_pack import framework

ComputeMemoryShare = framework.recipe_class("compute_memory_share", __name__)
