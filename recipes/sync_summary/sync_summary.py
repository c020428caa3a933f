"""sync_summary as an Nsight Systems recipe: a thin adapter over nsys_recipe_pack."""

from nsys_recipe.lib import recipe
from nsys_recipe.lib.args import Option

from nsys_recipe_pack import framework


class SyncSummary(recipe.Recipe):
    def run(self, context):
        super().run(context)
        framework.run_in_framework(self, context, "sync_summary")

    @classmethod
    def get_argument_parser(cls):
        parser = super().get_argument_parser()
        parser.add_recipe_argument(Option.INPUT, required=True)
        parser.add_recipe_argument(Option.OUTPUT)
        parser.add_recipe_argument(Option.FORCE_OVERWRITE)
        framework.add_recipe_options(parser, "sync_summary")
        return parser
