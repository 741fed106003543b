"""scale recipes list|show|check|explain"""

import json
import tempfile

COLUMNS = ["name", "paper", "table", "row", "model", "method", "engine", "global_batch", "epochs"]


def register(sub) -> None:
    parser = sub.add_parser("recipes", help="list, show, check and explain recipes")
    rsub = parser.add_subparsers(dest="recipes_command", required=True, metavar="ACTION")
    lst = rsub.add_parser("list", help="a table of every recipe")
    lst.add_argument("--json", action="store_true", help="print JSON for machines")
    lst.add_argument("--paper", help="only this paper (dino, mocov3, esvit, drloc)")
    lst.add_argument("--table", help="only this table (e.g. table2)")
    lst.set_defaults(func=cmd_list)
    show = rsub.add_parser("show", help="print the resolved YAML of a recipe")
    show.add_argument("recipe")
    show.add_argument("overrides", nargs="*", help="section.key=value")
    show.add_argument(
        "--sources",
        action="store_true",
        help="instead: each stated value with its source (paper section/table or official file and command), "
        "the assumptions, and the values with no source",
    )
    show.add_argument("--json", action="store_true", help="with --sources: print JSON for machines")
    show.add_argument(
        "--all",
        action="store_true",
        help="every section, also the method sections this recipe's method does not read",
    )
    show.set_defaults(func=cmd_show)
    check = rsub.add_parser(
        "check",
        help="load every recipe, build its model on the meta device, check its parameter count against the "
        "paper and every stated value against its recorded source; exit 1 listing failures",
    )
    check.add_argument("--paper", help="only this paper")
    check.add_argument("--table", help="only this table")
    check.add_argument(
        "--smoke",
        action="store_true",
        help="also train every passing recipe shrunk to a tiny model for a few steps on 2 gloo ranks",
    )
    check.add_argument("--smoke-dir", help="where smoke runs go (default: a temporary directory)")
    check.add_argument("--json", action="store_true", help="print JSON for machines")
    check.set_defaults(func=cmd_check)
    explain = rsub.add_parser(
        "explain", help="what a recipe key means: its description, type, default, allowed values and resume rule"
    )
    explain.add_argument("key", help="a dotted key, e.g. train.epochs; a section (e.g. optim) lists its keys")
    explain.set_defaults(func=cmd_explain)


def summary(path) -> dict:
    """The listing's row of one recipe, validated: `load_recipe` (~70 ms a recipe: OmegaConf's merge)."""
    from scale.config import load_recipe, recipe_name

    cfg = load_recipe(str(path))
    return {
        "name": recipe_name(path),
        "paper": cfg.meta.paper,
        "table": cfg.meta.table,
        "row": cfg.meta.row,
        "model": cfg.model.name,
        "method": cfg.method.kind,
        "engine": cfg.engine.kind,
        "global_batch": cfg.train.global_batch,
        "epochs": cfg.train.epochs,
    }


def _section_defaults() -> dict:
    """The schema's defaults of the listed sections, as plain values (the dataclasses, no OmegaConf)."""
    import dataclasses

    from scale.config.schema import Recipe

    return dataclasses.asdict(Recipe())


def quick_summary(path, defaults: dict) -> dict:
    """`summary(path)` from the YAML files alone: the `base:` chain merged as plain dicts over the schema defaults.
    Listing ~300 recipes through `load_recipe` took 20-30 CPU-seconds (OmegaConf merges and validation); the
    listing shows nine scalar values, which need neither. A value the plain merge cannot give as the loader would
    (an interpolation, a section that is not a mapping) sends that recipe through `summary`, which validates it.
    `scale recipes check` validates every recipe."""
    from scale.config.load import _load_chain, recipe_name

    values = {}
    for _, raw in _load_chain(path):
        for section in ("meta", "model", "method", "engine", "train"):
            part = raw.get(section, {})
            if not isinstance(part, dict):
                return summary(path)
            values.update({(section, key): value for key, value in part.items()})
    row = {"name": recipe_name(path)}
    for column, (section, key) in COLUMN_KEYS.items():
        value = values.get((section, key), defaults[section][key])
        if not isinstance(value, type(defaults[section][key])) or isinstance(value, bool) or "${" in str(value):
            return summary(path)
        row[column] = value
    return row


# the listing's columns: (section, key) in the recipe
COLUMN_KEYS = {
    "paper": ("meta", "paper"),
    "table": ("meta", "table"),
    "row": ("meta", "row"),
    "model": ("model", "name"),
    "method": ("method", "kind"),
    "engine": ("engine", "kind"),
    "global_batch": ("train", "global_batch"),
    "epochs": ("train", "epochs"),
}


def _selected(args) -> list:
    """Recipe paths of --paper / --table (recipes/<paper>/<table>/<row>.yaml)."""
    from scale.config import list_recipes, recipe_name

    check_filters(args)
    paths = []
    for path in list_recipes():
        parts = recipe_name(path).split("/")
        if args.paper and parts[0] != args.paper:
            continue
        if args.table and (len(parts) < 3 or parts[1] != args.table):
            continue
        paths.append(path)
    return paths


def cmd_list(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from scale.config import list_recipes

    check_filters(args)
    defaults = _section_defaults()
    rows = [quick_summary(p, defaults) for p in list_recipes()]
    rows = [
        r for r in rows if (not args.paper or r["paper"] == args.paper) and (not args.table or r["table"] == args.table)
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    console = Console()
    if not console.is_terminal:  # piped: as wide as the table (rich's default for a pipe is 80 columns)
        console = Console(width=100_000)
    table = Table(*COLUMNS)
    # names are what one copies into `scale train`: never wrapped or cut, whatever the terminal's width
    longest = max((len(r["name"]) for r in rows), default=4)
    table.columns[0].no_wrap = True
    table.columns[0].min_width = longest
    for row in rows:
        table.add_row(*(str(row[c]) for c in COLUMNS))
    console.print(table)
    return 0


def used_sections(cfg):
    """The recipe without the `method` sub-sections its method does not read (scale.methods.config.method_sections)."""
    from omegaconf import OmegaConf

    from scale.methods.config import method_sections

    data = OmegaConf.to_container(cfg)
    keep = method_sections(cfg.method.kind)
    data["method"] = {k: v for k, v in data["method"].items() if not isinstance(v, dict) or k in keep}
    return OmegaConf.create(data)


def check_filters(args) -> None:
    """--paper / --table that no recipe has: exit 2 naming the known ones (an empty table said nothing)."""
    from scale.config import list_recipes, recipe_name
    from scale.errors import UserError

    names = [recipe_name(p).split("/") for p in list_recipes()]
    papers = sorted({n[0] for n in names if len(n) >= 3})
    if args.paper and args.paper not in papers:
        raise UserError(f"--paper {args.paper}: no such paper; known: {', '.join(papers)}")
    tables = sorted({n[1] for n in names if len(n) >= 3 and (not args.paper or n[0] == args.paper)})
    if args.table and args.table not in tables:
        where = f" of {args.paper}" if args.paper else ""
        raise UserError(f"--table {args.table}: no such table{where}; known: {', '.join(tables)}")


def cmd_show(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from scale.config import load_recipe, to_yaml

    cfg = load_recipe(args.recipe, args.overrides)
    if not args.sources:
        print(to_yaml(cfg if args.all else used_sections(cfg)), end="")
        return 0
    from scale.recipes.provenance import source_table, written_keys

    rows = source_table(cfg, written_keys(args.recipe))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table("key", "value", "kind", "source")
    for row in rows:
        table.add_row(row["key"], json.dumps(row["value"]), row["kind"], row["source"])
    Console(width=max(Console().width, 160)).print(table)
    assumptions = [r["key"] for r in rows if r["kind"] == "assumption"]
    unsourced = [r["key"] for r in rows if r["kind"] == "none"]
    print(f"{len(rows)} stated values: {len(assumptions)} assumptions, {len(unsourced)} without a source")
    for key in assumptions:
        print(f"ASSUMPTION {key}")
    for key in unsourced:
        print(f"NO SOURCE {key}")
    return 0


def _short(message: str, width: int = 100) -> str:
    """The table's cell: the first problem (the FAIL lines below list them all)."""
    problems = message.split("; ")
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    first = problems[0] if len(problems[0]) <= width else problems[0][: width - 3] + "..."
    return first + more


def cmd_check(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from scale.recipes.check import check_recipe
    from scale.recipes.smoke import ensure_smoke_data, smoke_run

    results = []
    smoke_dir = args.smoke_dir or (tempfile.mkdtemp(prefix="scale-smoke-") if args.smoke else None)
    data = ensure_smoke_data() if args.smoke else None
    for path in _selected(args):
        result = check_recipe(path)
        row = {"name": result.name, "ok": result.ok, "params_m": result.params_m, "message": result.message}
        if args.smoke and result.ok:
            status = smoke_run(str(path), smoke_dir, data)
            row["smoke"] = "ok" if status == 0 else f"exit {status}"
            row["ok"] = status == 0
        results.append(row)
    failed = [r for r in results if not r["ok"]]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        table = Table("recipe", "params (M)", "result", *(["smoke"] if args.smoke else []))
        for r in results:
            params = "" if r["params_m"] is None else f"{r['params_m']:.2f}"
            table.add_row(
                r["name"],
                params,
                "ok" if r["ok"] else _short(r["message"] or "failed"),
                *([r.get("smoke", "-")] if args.smoke else []),
            )
        Console().print(table)
        where = f"; smoke runs in {smoke_dir}" if smoke_dir else ""
        print(f"{len(results) - len(failed)} of {len(results)} recipes pass{where}")
        for r in failed:
            print(f"FAIL {r['name']}: {r['message'] or r.get('smoke')}")
    return 1 if failed else 0


def cmd_explain(args) -> int:
    """One key from the schema (scale/config/describe.py); a section prefix lists the keys under it."""
    import difflib

    from scale.config.describe import describe_all
    from scale.errors import UserError

    infos = describe_all()
    one = [i for i in infos if i.key == args.key]
    under = [i for i in infos if i.key.startswith(args.key.rstrip(".") + ".")]
    if not one and not under:
        close = difflib.get_close_matches(args.key, [i.key for i in infos], n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `scale recipes explain SECTION` lists a section"
        raise UserError(f"no recipe key '{args.key}'{hint}")
    for info in one or under:
        print(info.key)
        print(f"  {info.description or '(no description)'}")
        print(f"  type: {info.type}   default: {json.dumps(info.default)}")
        print(f"  allowed: {info.allowed or 'any ' + info.type}   on resume: {RESUME_WORDS[info.resume]}")
    return 0


# the resume rules (scale/config/fields.py) as `explain` and the reference page say them
RESUME_WORDS = {
    "free": "may change",
    "noted": "may change; the resumed run logs the change",
    "fixed": "must stay as saved (a resume with another value is refused)",
}
