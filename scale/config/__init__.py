"""Recipes: scale.config.load (find, merge, validate), scale.config.schema (the typed sections) and
scale.config.fields (the rules fields declare). The loader's functions are imported on first use, so that the
sections' modules can import scale.config.fields without importing the schema that imports them."""

__all__ = ["list_recipes", "load_recipe", "recipe_name", "to_yaml"]


def __getattr__(name: str):
    if name in __all__:
        from scale.config import load

        return getattr(load, name)
    raise AttributeError(f"module 'scale.config' has no attribute '{name}'")
