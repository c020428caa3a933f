"""nvtx_gpu_proj as an Nsight Systems recipe: a thin adapter over nsys_recipe_pack."""

from nsys_recipe.lib import recipe
from nsys_recipe.lib.args import Option

from nsys_recipe_pack import framework


class NvtxGpuProj(recipe.Recipe):
    def run(self, context):
        super().run(context)
        framework.run_in_framework(self, context, "nvtx_gpu_proj")

    @classmethod
    def get_argument_parser(cls):
        parser = super().get_argument_parser()
        parser.add_recipe_argument(Option.INPUT, required=True)
        parser.add_recipe_argument(Option.OUTPUT)
        parser.add_recipe_argument(Option.FORCE_OVERWRITE)
        framework.add_recipe_options(parser, "nvtx_gpu_proj")
        return parser
