"""scale recipes list|show|check"""

import json

from rich.console import Console
from rich.table import Table

from scale.config import list_recipes, load_recipe, recipe_name, to_yaml

COLUMNS = ["name", "paper", "table", "row", "model", "method", "engine", "global_batch", "epochs"]


def register(sub) -> None:
    parser = sub.add_parser("recipes", help="list, show and check recipes")
    rsub = parser.add_subparsers(dest="recipes_command", required=True, metavar="ACTION")
    lst = rsub.add_parser("list", help="a table of every recipe")
    lst.add_argument("--json", action="store_true", help="print JSON for machines")
    lst.add_argument("--paper", help="only this paper (dino, mocov3, esvit, drloc)")
    lst.add_argument("--table", help="only this table (e.g. table2)")
    lst.set_defaults(func=cmd_list)
    show = rsub.add_parser("show", help="print the resolved YAML of a recipe")
    show.add_argument("recipe")
    show.add_argument("overrides", nargs="*", help="section.key=value")
    show.set_defaults(func=cmd_show)


def summary(path) -> dict:
    cfg = load_recipe(str(path))
    return {"name": recipe_name(path), "paper": cfg.meta.paper, "table": cfg.meta.table, "row": cfg.meta.row,
            "model": cfg.model.name, "method": cfg.method.kind, "engine": cfg.engine.kind,
            "global_batch": cfg.train.global_batch, "epochs": cfg.train.epochs}


def cmd_list(args) -> int:
    rows = [summary(p) for p in list_recipes()]
    rows = [r for r in rows if (not args.paper or r["paper"] == args.paper) and (not args.table or r["table"] == args.table)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(*COLUMNS)
    for row in rows:
        table.add_row(*(str(row[c]) for c in COLUMNS))
    Console().print(table)
    return 0


def cmd_show(args) -> int:
    print(to_yaml(load_recipe(args.recipe, args.overrides)), end="")
    return 0
