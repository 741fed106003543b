"""scale shards build|verify|dali-index"""

from pathlib import Path


def register(sub) -> None:
    parser = sub.add_parser("shards", help="build and verify WebDataset shards (see data_shards/README.md)")
    ssub = parser.add_subparsers(dest="shards_command", required=True, metavar="ACTION")
    build = ssub.add_parser("build", help="write shards from a source data set (resumes a partial build)")
    build.add_argument(
        "--source",
        required=True,
        help="KIND:PATH, KIND in imagefolder, imagenet22k, openimages, embedded (embedded:digits)",
    )
    build.add_argument("--out", required=True, help="shard directory (embedded: writes OUT/train and OUT/val)")
    build.add_argument("--labels", help="openimages: image-level label CSV (ImageID,Source,LabelName,Confidence)")
    build.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    build.add_argument("--max-side", type=int, help="re-encode images whose longest side exceeds this (px)")
    build.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images")
    build.add_argument("--workers", type=int, default=1, help="processes writing shards")
    build.set_defaults(func=cmd_build)
    verify = ssub.add_parser("verify", help="check every shard against the manifest")
    verify.add_argument("dir")
    verify.add_argument("--no-decode", action="store_true", help="skip decoding every image")
    verify.set_defaults(func=cmd_verify)
    dali_index = ssub.add_parser(
        "dali-index",
        help="write the index files of DALI's webdataset reader (data.backend=dali; `build` writes them too)",
    )
    dali_index.add_argument("dir")
    dali_index.set_defaults(func=cmd_dali_index)


def cmd_build(args) -> int:
    from scale.data import embedded
    from scale.data.shards.write import build_shards
    from scale.data.sources import open_source, parse_source

    kind, path = parse_source(args.source)
    if kind == "embedded":
        dirs = embedded.build(path, args.out, progress=True)
        print(f"wrote {dirs['train']} and {dirs['val']}")
        return 0
    manifest = build_shards(
        open_source(kind, path, args.labels),
        args.out,
        shard_size=args.shard_size,
        max_side=args.max_side,
        workers=args.workers,
        quality=args.quality,
    )
    print(
        f"wrote {manifest['num_samples']} samples in {len(manifest['shards'])} shards to {args.out}; "
        f"skipped {manifest['num_skipped']} input file(s) (listed with reasons in "
        f"{Path(args.out) / manifest['skipped_report']})"
    )
    empty = manifest["empty_classes"]
    if empty:
        print(f"{len(empty)} class(es) have no sample: {', '.join(empty)}")
    return 0


def cmd_verify(args) -> int:
    from scale.data.shards.verify import verify

    problems = verify(args.dir, decode=not args.no_decode, progress=True)
    for problem in problems:
        print(problem)
    print(f"{args.dir}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def cmd_dali_index(args) -> int:
    from scale.data.dali.index import write_dali_indexes

    paths = write_dali_indexes(args.dir)
    print(f"{args.dir}: {len(paths)} DALI index file(s) up to date")
    return 0
