from scale.config.load import list_recipes, load_recipe, recipe_name, to_yaml

__all__ = ["list_recipes", "load_recipe", "recipe_name", "to_yaml"]
