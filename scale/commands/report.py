"""scale report RUN_DIR... [--out DIR]"""


def register(sub) -> None:
    parser = sub.add_parser("report", help="markdown table of paper numbers next to measured ones, with PNG plots")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (config.yaml, metrics.jsonl)")
    parser.add_argument("--out", default="report", help="output directory for report.md and the plots")
    parser.add_argument("--title", default="scale report", help="the report's heading")
    parser.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from scale.report import write_report

    print(write_report(args.run_dirs, args.out, title=args.title))
    return 0
