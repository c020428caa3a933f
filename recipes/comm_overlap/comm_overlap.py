"""comm_overlap as an Nsight Systems recipe: a thin adapter; the work is done by nsys_recipe_pack."""

from nsys_recipe_pack import framework

CommOverlap = framework.recipe_class("comm_overlap", __name__)
