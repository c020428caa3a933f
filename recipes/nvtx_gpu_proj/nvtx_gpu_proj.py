"""nvtx_gpu_proj as an Nsight Systems recipe: a thin adapter; the work is done by nsys_recipe_pack."""

from nsys_recipe_pack import framework

NvtxGpuProj = framework.recipe_class("nvtx_gpu_proj", __name__)
