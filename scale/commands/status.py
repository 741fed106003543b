"""scale status RUN_DIR [--json]"""

import json
from pathlib import Path


def register(sub) -> None:
    parser = sub.add_parser("status", help="progress, throughput, ETA, last checkpoint and Slurm state of a run")
    parser.add_argument("run_dir", help="a run directory, or the directory of a sweep (one row per task)")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from scale.errors import UserError
    from scale.launch.status import is_run_dir, run_status, summary_row, sweep_tasks

    if not Path(args.run_dir).is_dir():
        raise UserError(f"run directory not found: {args.run_dir}")
    if not is_run_dir(Path(args.run_dir)):
        raise UserError(
            f"{args.run_dir}: not a run directory (no config.yaml, metrics.jsonl, checkpoints/ or submitted job, "
            "and no sweep tasks)"
        )
    runs = sweep_tasks(args.run_dir) or [Path(args.run_dir)]
    statuses = [run_status(run) for run in runs]
    if args.json:
        print(json.dumps([s.as_dict() for s in statuses], indent=2))
        return 0
    rows = [summary_row(s) for s in statuses]
    console = Console()
    if len(rows) == 1:
        for key, value in rows[0].items():
            console.print(f"{key:>11}: {value}", highlight=False)
        return 0
    table = Table("task", *list(rows[0])[1:])
    for run, row in zip(runs, rows):
        table.add_row(run.name, *list(row.values())[1:])
    console.print(table)
    return 0
