"""gpu_memory as an Nsight Systems recipe: a thin adapter; the work is done by nsys_recipe_pack."""

from nsys_recipe_pack import framework

GpuMemory = framework.recipe_class("gpu_memory", __name__)
