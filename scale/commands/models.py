"""scale models table [--json] [--models a,b,c]"""

import json

# (row key, title, format)
COLUMNS = [
    ("model", "model", "{}"),
    ("params_M", "params (M)", "{:.2f}"),
    ("global_px", "global px", "{}"),
    ("global_GMACs", "GMACs global", "{:.2f}"),
    ("global_tokens", "tokens global", "{}"),
    ("local_px", "local px", "{}"),
    ("local_GMACs", "GMACs local", "{:.3f}"),
    ("local_tokens", "tokens local", "{}"),
    ("recipes", "recipes", "{}"),
]


def register(sub) -> None:
    parser = sub.add_parser("models", help="backbone sizes and compute")
    msub = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    tab = msub.add_parser(
        "table",
        help="parameters, multiply-adds and tokens at the global (224 px) and local (96 px) crop, each rounded to a multiple of the patch",
    )
    tab.add_argument("--json", action="store_true", help="print JSON for machines")
    tab.add_argument(
        "--models",
        help="comma-separated name[/patch][/wWINDOW][/hHEADS], e.g. vit_large/7,swin_base/w14"
        " (default: the papers' models and every model a recipe uses)",
    )
    tab.set_defaults(func=cmd_table)


def cmd_table(args) -> int:
    from scale.models.table import table  # imports torch and timm: only when this command runs

    specs = [s for s in args.models.split(",") if s.strip()] if args.models else None
    if args.json:
        print(json.dumps(list(table(specs)), indent=2))
        return 0
    columns = COLUMNS if specs is None else COLUMNS[:-1]  # named models have no recipes column
    widths = [46] + [max(len(title), 10) for _, title, _ in columns[1:]]  # model: name/patch/window/heads, options
    print(_line([title for _, title, _ in columns], widths))
    for row in table(specs):  # each row as soon as it is counted
        cells = {**row, "recipes": len(row.get("recipes", []))}
        print(_line([fmt.format(cells[key]) for key, _, fmt in columns], widths), flush=True)
    return 0


def _line(cells: list[str], widths: list[int]) -> str:
    """The model column left-aligned, the numbers right-aligned."""
    return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths)))
