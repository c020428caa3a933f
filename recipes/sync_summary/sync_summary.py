"""sync_summary as an Nsight Systems recipe: a thin adapter; the work is done by nsys_recipe_pack."""

from nsys_recipe_pack import framework

SyncSummary = framework.recipe_class("sync_summary", __name__)
