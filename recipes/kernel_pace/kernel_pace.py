"""kernel_pace as an Nsight Systems recipe: a thin adapter; the work is done by nsys_recipe_pack."""

from nsys_recipe_pack import framework

KernelPace = framework.recipe_class("kernel_pace", __name__)
