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
    from rich.console import Console
    from rich.table import Table

    from scale.models.table import table  # imports torch and timm: only when this command runs

    specs = [s for s in args.models.split(",") if s.strip()] if args.models else None
    rows = table(specs)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    columns = [c for c in COLUMNS if any(c[0] in row for row in rows)]
    out = Table(*(title for _, title, _ in columns))
    for row in rows:
        cells = {**row, "recipes": len(row["recipes"])} if "recipes" in row else row
        out.add_row(*(fmt.format(cells[key]) for key, _, fmt in columns))
    console = Console()
    Console(width=max(console.width, 130)).print(out)  # keep every column readable when piped
    return 0
