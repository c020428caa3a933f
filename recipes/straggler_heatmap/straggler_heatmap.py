"""straggler_heatmap as an Nsight Systems recipe: a thin adapter; the work is done by nsys_recipe_pack."""

from nsys_recipe_pack import framework

StragglerHeatmap = framework.recipe_class("straggler_heatmap", __name__)
